"""XLA's HloCostAnalysis (FLOPs, bytes accessed) of a compiled module, read from its HLO text.

``compiled.cost_analysis()`` runs XLA's analysis where the compiler offers it; the GPU
compile-only client does not, and jax has no public entry point to the analysis itself. This
module applies the same rules to ``compiled.as_text()``: ``hlo_text_cost(text) -> {"flops",
"bytes accessed"}``. tests/test_compile.py checks it equal to XLA's own figures on CPU.
"""

from __future__ import annotations

import dataclasses
import math
import re

from bert_jax.plan import hlo

# Opcodes HloCostAnalysis counts as elementwise: one FLOP per result element, except the
# transcendental ones, which it counts apart from FLOPs (so none here).
_ELEMENTWISE = frozenset(
  "abs add and atan2 bitcast-convert cbrt ceil clamp compare complex convert cosine "
  "count-leading-zeros divide erf exponential exponential-minus-one floor imag is-finite log "
  "log-plus-one logistic maximum minimum multiply negate not or popcnt power real "
  "reduce-precision remainder round-nearest-afz round-nearest-even rsqrt select shift-left "
  "shift-right-arithmetic shift-right-logical sign sine sqrt stochastic-convert subtract tan "
  "tanh xor".split()
)  # fmt: skip
_TRANSCENDENTAL = frozenset(
  "exponential log logistic power sqrt cbrt rsqrt tanh sine cosine tan exponential-minus-one "
  "log-plus-one atan2 erf".split()
)  # fmt: skip
_NO_BYTES = frozenset(("parameter", "constant", "get-tuple-element", "bitcast", "after-all",
                       "add-dependency", "domain"))  # fmt: skip
_POINTER_BYTES = 8  # what a ``tuple`` instruction writes per element: a pointer
_HLO_OP = re.compile(r"\s*([a-z][\w\-]*)\(")
_COMMENT = re.compile(r"/\*.*?\*/")


def _type_end(text: str) -> int:
  """Where the HLO type at the start of ``text`` ends (a tuple's closing parenthesis, else
  the first space)."""
  if not text.startswith("("):
    space = text.find(" ")
    return space if space >= 0 else len(text)
  depth = 0
  for i, ch in enumerate(text):
    depth += ch in "([{"
    depth -= ch in ")]}"
    if depth == 0:
      return i + 1
  return len(text)


def _elements(type_text: str) -> int:
  """Elements of an array type (a tuple's first array: a variadic reduce's result)."""
  m = hlo._SHAPE.search(type_text)
  return math.prod(int(d) for d in m.group(2).split(",") if d) if m else 0


def _dims(type_text: str) -> list[int]:
  m = hlo._SHAPE.search(type_text)
  return [int(d) for d in m.group(2).split(",") if d] if m else []


@dataclasses.dataclass
class _Instr:
  name: str
  type: str  # the result's HLO type
  op: str
  operands: list[str]  # instruction names
  attrs: str
  arg: str = ""  # a parameter's number, a constant's literal
  root: bool = False


def _parse_instr(line: str) -> _Instr | None:
  m = hlo._INSTR.match(_COMMENT.sub("", line))  # long lists carry /*index=5*/ marks
  if not m:
    return None
  rest = m.group(2).strip()
  end = _type_end(rest)
  op = _HLO_OP.match(rest[end:])
  if not op:
    return None
  start = end + op.end()
  depth, close = 1, len(rest)
  for i in range(start, len(rest)):
    depth += rest[i] in "([{"
    depth -= rest[i] in ")]}"
    if depth == 0:
      close = i
      break
  args, operands, depth, begin = rest[start:close], [], 0, 0
  if op.group(1) not in ("parameter", "constant"):
    for i, ch in enumerate(args + ","):
      if ch in "([{":
        depth += 1
      elif ch in ")]}":
        depth -= 1
      elif ch == "," and depth == 0:
        token = args[begin:i].strip()
        if token:
          operands.append(token.split()[-1].lstrip("%"))
        begin = i + 1
  return _Instr(
    m.group(1), rest[:end], op.group(1), operands, rest[close + 1 :], args,
    line.lstrip().startswith("ROOT "),
  )  # fmt: skip


def _called(attrs: str, key: str) -> list[str]:
  """Computations an instruction names in ``key=%c`` or ``key={%a, %b}``."""
  m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", attrs)
  return re.findall(r"%?([\w.\-]+)", m.group(1)) if m else []


class _HloCost:
  """HloCostAnalysis's FLOPs and bytes accessed (xla/service/hlo_cost_analysis.cc), over the
  computations of an HLO module's text."""

  def __init__(self, text: str):
    comps, self.entry = hlo._split_computations(text)
    self.comps = {
      name: [i for i in map(_parse_instr, lines) if i is not None] for name, lines in comps.items()
    }
    self.types = {i.name: i.type for instrs in self.comps.values() for i in instrs}
    self.memo: dict[str, tuple[float, float]] = {}

  def computation(self, name: str) -> tuple[float, float]:
    """(flops, bytes accessed) of one run of computation ``name``."""
    if name not in self.memo:
      self.memo[name] = (0.0, 0.0)  # a cycle (there is none in valid HLO) costs nothing
      flops = nbytes = 0.0
      for instr in self.comps.get(name, []):
        f, b = self.instruction(instr)
        flops, nbytes = flops + f, nbytes + b
      self.memo[name] = (flops, nbytes)
    return self.memo[name]

  def _size(self, name: str) -> float:
    """Bytes of an instruction's result: its arrays' (all of a tuple's; a token none)."""
    return hlo.shape_bytes(self.types.get(name, ""))

  def instruction(self, i: _Instr) -> tuple[float, float]:
    op, out = i.op, hlo.shape_bytes(i.type)
    default = out + sum(map(self._size, i.operands))
    if op in _NO_BYTES:
      return 0.0, 0.0
    if op in _ELEMENTWISE:
      return (0.0 if op in _TRANSCENDENTAL else float(_elements(i.type))), default
    if op == "fusion":
      return self.fusion(i)
    if op in ("call", "async-start"):
      return self.computation(_called(i.attrs, "calls" if op == "async-start" else "to_apply")[0])
    if op == "while":
      body = self.computation(_called(i.attrs, "body")[0])
      cond = self.computation(_called(i.attrs, "condition")[0])
      return body[0] + cond[0], body[1] + cond[1]
    if op == "conditional":
      branches = _called(i.attrs, "branch_computations") or (
        _called(i.attrs, "true_computation") + _called(i.attrs, "false_computation")
      )
      costs = [self.computation(c) for c in branches] or [(0.0, 0.0)]
      return max(c[0] for c in costs), max(c[1] for c in costs)
    if op == "tuple":
      return 0.0, _POINTER_BYTES * len(hlo._tuple_elements(i.type))
    if op == "slice":
      return 0.0, 2 * out
    if op == "dynamic-slice":
      return 0.0, 2 * out + self._size(i.operands[1])
    if op == "dynamic-update-slice":
      return 0.0, 2 * self._size(i.operands[1]) + self._size(i.operands[2])
    if op == "gather":
      return 0.0, 2 * out + self._size(i.operands[1])
    if op == "dot":
      lhs = _dims(self.types.get(i.operands[0], ""))
      m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", i.attrs)
      k = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
      return 2.0 * _elements(i.type) * k, default
    if op in ("reduce", "map", "scatter", "reduce-window"):
      sub = self.computation(_called(i.attrs, "to_apply")[0])[0] if "to_apply=" in i.attrs else 0
      if op == "reduce":
        count = _elements(self.types.get(i.operands[0], "")) - _elements(i.type)
      elif op == "map":
        count = _elements(i.type)
      elif op == "scatter":
        n = len(i.operands) // 2  # operands, indices, updates
        updates = i.operands[n + 1 :]
        size = sum(map(self._size, updates))
        return sub * _elements(self.types.get(updates[0], "")), 3 * size + self._size(i.operands[n])
      else:
        window = re.search(r"size=([\dx]+)", i.attrs)
        size = math.prod(int(d) for d in window.group(1).split("x")) if window else 1
        count = (size - 1) * _elements(i.type)
      return sub * count, default
    if op == "sort":
      n = _elements(self.types.get(i.operands[0], ""))
      return float(n * math.ceil(math.log2(n))) if n > 1 else 0.0, default
    if op in ("all-reduce", "all-reduce-start"):
      arrays = hlo._tuple_elements(i.type) if i.type.startswith("(") else [i.type]
      outs = sum(hlo.shape_bytes(a) for a in arrays)
      return float(sum(map(_elements, arrays))), outs + sum(map(self._size, i.operands))
    if op == "custom-call":
      return -1.0, -1.0  # unknown: HloCostAnalysis marks a custom call's cost -1
    if op == "convolution":
      return self.convolution(i), default
    return 0.0, default

  def convolution(self, i: _Instr) -> float:
    """2 x output elements x input features per group x kernel window (padding ignored)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", i.attrs)
    lhs = _dims(self.types.get(i.operands[0], ""))
    if not labels or not lhs:
      return 0.0
    groups = re.search(r"feature_group_count=(\d+)", i.attrs)
    window = re.search(r"size=([\dx]+)", i.attrs)
    features = lhs[labels.group(1).index("f")] // (int(groups.group(1)) if groups else 1)
    size = math.prod(int(d) for d in window.group(1).split("x")) if window else 1
    return 2.0 * _elements(i.type) * features * size

  def fusion(self, i: _Instr) -> tuple[float, float]:
    callee = _called(i.attrs, "calls")[0]
    if "kind=kCustom" in i.attrs:  # a custom fusion around a gather or scatter costs as that
      inner = next((x for x in self.comps.get(callee, []) if x.op in ("gather", "scatter")), None)
      if inner is not None:
        return self.instruction(inner)
    flops = self.computation(callee)[0]
    instrs = self.comps.get(callee, [])
    by_name = {x.name: x for x in instrs}
    root = next((x for x in instrs if x.root), instrs[-1] if instrs else None)
    nbytes = 0.0
    if root is not None and root.op == "dynamic-update-slice" and not i.type.startswith("("):
      nbytes += self._size(root.operands[1])
    elif i.type.startswith("(") and root is not None and root.op == "tuple":
      for element, operand in zip(hlo._tuple_elements(i.type), root.operands):
        src = by_name.get(operand)
        if src is not None and src.op == "dynamic-update-slice":
          nbytes += self._size(src.operands[1])
        else:
          nbytes += hlo.shape_bytes(element)
    else:
      nbytes += hlo.shape_bytes(i.type)
    for x in instrs:
      if x.op == "constant" and _elements(x.type) > 1:
        nbytes += hlo.shape_bytes(x.type)
    users = self._users(callee)
    for param in self._parameters(callee):
      nbytes += self._read_bytes(param, users)
    return flops, nbytes

  def _parameters(self, comp: str) -> list[_Instr]:
    """A computation's parameters in their order."""
    params = [x for x in self.comps.get(comp, []) if x.op == "parameter"]
    return sorted(params, key=lambda x: int(x.arg) if x.arg.strip().isdigit() else 0)

  def _users(self, comp: str) -> dict[str, list[_Instr]]:
    """{instruction: the instructions of ``comp`` that use it (each once)}."""
    users: dict[str, list[_Instr]] = {}
    for x in self.comps.get(comp, []):
      for operand in dict.fromkeys(x.operands):
        users.setdefault(operand, []).append(x)
    return users

  def _read_bytes(self, param: _Instr, users: dict[str, list[_Instr]]) -> float:
    """FusionParameterReadBytes: what a fused parameter costs to read, by its users."""
    if param.type.startswith("("):  # a tuple parameter: each element, through its gte
      total = 0.0
      for user in users.get(param.name, []):
        if user.op == "get-tuple-element":
          total += self._read_bytes(user, users)
      return total
    size, seen_trivial = 0.0, False
    own = hlo.shape_bytes(param.type)
    for user in users.get(param.name, []):
      if user.op == "fusion":
        inner = _called(user.attrs, "calls")[0]
        inner_params, inner_users = self._parameters(inner), self._users(inner)
        for idx, operand in enumerate(user.operands):
          if operand == param.name and idx < len(inner_params):
            size += self._read_bytes(inner_params[idx], inner_users)
      elif user.op == "slice":
        size += hlo.shape_bytes(user.type)
      elif user.op == "dynamic-slice":
        if user.operands[0] == param.name:
          size += hlo.shape_bytes(user.type)
        elif not seen_trivial:
          seen_trivial, size = True, size + own
      elif user.op == "dynamic-update-slice":
        if user.operands[0] != param.name and not seen_trivial:
          seen_trivial, size = True, size + own
      elif user.op in ("broadcast", "reshape"):
        size += own
      elif not seen_trivial:
        seen_trivial, size = True, size + own
    return size


def hlo_text_cost(text: str) -> dict[str, float]:
  """{"flops", "bytes accessed"} of a compiled module's HLO text (``compiled.as_text()``) by
  the rules of XLA's HloCostAnalysis, which ``compiled.cost_analysis()`` runs where the
  compiler offers it: the entry computation's instructions; a fusion's FLOPs those of its fused
  instructions and its bytes its result plus what it reads of each operand (a slice of it only
  the slice); a ``while`` loop's body once; a custom call -1 of each (unknown)."""
  cost = _HloCost(text)
  return dict(zip(("flops", "bytes accessed"), cost.computation(cost.entry)))
