"""Config files loaded by path (``--config configs/glue.py:rte``) import their siblings by
package (``from configs import common``). ``add_import_root(file)`` makes that work from a
checkout, from an installed console script run anywhere, and for config folders of one's own:
it puts on ``sys.path`` the folder holding the outermost package around ``file`` (a folder with
``__init__.py``), or the file's own folder when it is in no package.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence


def add_import_root(file: pathlib.Path | str) -> None:
  root = pathlib.Path(file).resolve().parent
  while (root / "__init__.py").is_file():
    root = root.parent
  if str(root) not in sys.path:
    sys.path.insert(0, str(root))


def add_config_import_roots(argv: Sequence[str], flag: str = "config") -> None:
  """``add_import_root`` for the file of every ``--<flag>=PATH[:ARG]`` / ``--<flag> PATH`` in
  ``argv`` that names an existing ``.py`` file (anything else is left to the flag's parser)."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{flag}="):
      spec = arg.split("=", 1)[1]
    elif arg == f"--{flag}" and i + 1 < len(argv):
      spec = argv[i + 1]
    else:
      continue
    path = pathlib.Path(spec.split(":", 1)[0])
    if path.suffix == ".py" and path.is_file():
      add_import_root(path)
