"""TPU slice names as Cloud TPU spells them: a v4 / v5p accelerator type counts TensorCores (two
per megacore chip), so an odd count names no slice; v5e and v6e count chips."""

from __future__ import annotations

import pytest

from bert_jax.parallel.topology import parse_topology


@pytest.mark.parametrize(
  "name, shape",
  [("v4-8", (2, 2, 1)), ("v4-32", (2, 2, 4)), ("v5p-8", (2, 2, 1)), ("v5e-16", (4, 4))],
)
def test_accelerator_types_name_their_chips(name, shape):
  assert parse_topology(name).shape == shape


@pytest.mark.parametrize("name", ["v4-31", "v4-33", "v5p-9"])
def test_an_odd_core_count_on_megacore_chips_is_refused(name):
  with pytest.raises(ValueError, match=f"unknown TPU topology '{name}'"):
    parse_topology(name)
