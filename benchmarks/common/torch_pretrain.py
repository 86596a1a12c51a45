"""The PyTorch reference pre-training run: Hugging Face's ``BertForPreTraining`` (SDPA attention)
with ``torch.optim.AdamW``, on bert_jax's pre-training TFRecords, for a wall-clock budget.

  python -m benchmarks.common.torch_pretrain --workdir=/tmp/pt --size=mini \
      --train_files='/d/train/seq_128/*.tfrecord' --eval_files='/d/heldout/seq_128/*.tfrecord' \
      --vocab_file=/d/vocab.txt --batch_size=64 --learning_rate=5e-4 --warmup_steps=1000 \
      --budget_seconds=1800 --eval_every_seconds=60

What a user picking PyTorch would run, matched to bert_jax's recipe: the model size of
``BertConfig.from_preset(size)``, dropout 0.1 (hidden and attention), AdamW (b1 0.9, b2 0.999,
eps 1e-6, decoupled weight decay 0.01 on every parameter except LayerNorm and biases, as
``bert_jax.train.optimizers``), gradient clipping to global norm 1.0, a linear warmup then a
constant learning rate (``config.optimizer.schedule="constant"`` on the bert_jax side).
``--mlm_head=all`` is Hugging Face's own form (``labels`` = -100 except at the masked positions:
the output layer runs at every position); ``--mlm_head=masked`` runs it at the masked positions
only, as bert_jax does. The records are read without TensorFlow (``read_records``), shuffled per
epoch with the run's seed.

Time: the training clock (seconds) counts everything but evaluations and checkpoint saves,
from the process start (imports and reading the records included); ``--budget_seconds`` of it
ends the run. Every ``--eval_every_seconds`` of it the held-out records are evaluated (MLM loss
and accuracy over the masked tokens, NSP accuracy) and the state saved (``state.pt``: model,
optimizer, schedule, data position, random states, clock, history). A rerun resumes it; SIGTERM
or Ctrl-C saves and exits. The end writes ``history.json`` and ``hf/`` (``save_pretrained`` +
vocab.txt: a Hugging Face directory that fine-tuning accepts).
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import signal
import struct
import time

import numpy as np

from benchmarks.common import flags

_INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")


def _varints(buf: bytes) -> np.ndarray:
  """Every varint of a packed protobuf payload, decoded at once (numpy)."""
  b = np.frombuffer(buf, np.uint8)
  if b.size == 0:
    return np.zeros(0, np.int64)
  ends = np.flatnonzero(b < 0x80)
  starts = np.concatenate([[0], ends[:-1] + 1])
  group = np.repeat(np.arange(ends.size), ends - starts + 1)
  shift = 7 * (np.arange(b.size) - starts[group])
  return np.add.reduceat((b & 0x7F).astype(np.int64) << shift, starts)


def _fields(buf: bytes, pos: int = 0, end: int | None = None):
  """(field number, payload bytes) of the length-delimited fields of a message."""
  end = len(buf) if end is None else end
  while pos < end:
    key, pos = _read_varint(buf, pos)
    if key & 7 != 2:
      raise ValueError(f"unexpected protobuf wire type {key & 7}")
    n, pos = _read_varint(buf, pos)
    yield key >> 3, buf[pos : pos + n]
    pos += n


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = buf[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return value, pos


def read_records(pattern: str) -> dict[str, np.ndarray]:
  """Every record of the pre-training TFRecords matching ``pattern`` (comma-separated globs),
  in file order: {feature: [N, K] int32 / float32}, without TensorFlow."""
  paths = sorted({p for pat in pattern.split(",") if pat for p in glob.glob(pat)})
  if not paths:
    raise ValueError(f"--train_files/--eval_files {pattern!r} matches no file")
  payloads: dict[str, list[bytes]] = {}
  n = 0
  for path in paths:
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack_from("<Q", data, pos)
      record = data[pos + 12 : pos + 12 + length]
      pos += 16 + length
      n += 1
      for _, features in _fields(record):  # Example.features
        for _, entry in _fields(features):  # Features.feature map entries
          parts = dict(_fields(entry))
          name, (kind, values) = parts[1].decode(), next(_fields(parts[2]))
          packed = dict(_fields(values)).get(1, b"")
          payloads.setdefault(name, []).append(packed if kind in (2, 3) else b"")
  out = {}
  for name, chunks in payloads.items():
    joined = b"".join(chunks)
    if name == "masked_lm_weights":
      out[name] = np.frombuffer(joined, "<f4").reshape(n, -1).astype(np.float32)
    else:
      out[name] = _varints(joined).reshape(n, -1).astype(np.int32)
  out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
  return out


def hf_model(size: str, vocab_size: int, hidden_dropout: float, attention_dropout: float):
  """A fresh ``BertForPreTraining`` (SDPA attention) of bert_jax's preset ``size``."""
  import transformers  # optional (not a bert_jax dependency), heavy

  from bert_jax.model.config import BertConfig  # imports jax, flax: after torch, in the clock

  bert = BertConfig.from_preset(size, vocab_size=vocab_size)
  config = transformers.BertConfig(
    vocab_size=vocab_size,
    hidden_size=bert.hidden_size,
    num_hidden_layers=bert.num_hidden_layers,
    num_attention_heads=bert.num_attention_heads,
    intermediate_size=bert.intermediate_size,
    hidden_act=bert.hidden_act,
    hidden_dropout_prob=hidden_dropout,
    attention_probs_dropout_prob=attention_dropout,
    max_position_embeddings=bert.max_position_embeddings,
    type_vocab_size=bert.type_vocab_size,
    initializer_range=bert.initializer_range,
    layer_norm_eps=bert.layer_norm_eps,
  )
  return transformers.BertForPreTraining._from_config(config, attn_implementation="sdpa")


def param_groups(model, weight_decay: float) -> list[dict]:
  """AdamW's groups: weight decay on every parameter but LayerNorm's and biases (as BERT)."""
  decay, no_decay = [], []
  for name, p in model.named_parameters():
    (no_decay if "LayerNorm" in name or name.endswith("bias") else decay).append(p)
  return [
    {"params": decay, "weight_decay": weight_decay},
    {"params": no_decay, "weight_decay": 0.0},
  ]


def loss_terms(model, batch: dict, mlm_head: str):
  """(loss, sums): the training loss (MLM mean over the masked tokens + NSP mean) and the summed
  evaluation terms, for a batch of torch tensors. ``mlm_head``: "all" (Hugging Face's labels
  form) or "masked" (the output layer at the masked positions only)."""
  import torch  # optional (not a bert_jax dependency), heavy
  import torch.nn.functional as F  # optional, heavy

  positions, ids = batch["masked_lm_positions"].long(), batch["masked_lm_ids"].long()
  weights = batch["masked_lm_weights"]
  nsp_labels = batch["next_sentence_labels"].long()
  inputs = dict(
    input_ids=batch["input_ids"].long(),
    attention_mask=batch["input_mask"].long(),
    token_type_ids=batch["segment_ids"].long(),
  )
  if mlm_head == "all":
    labels = torch.full_like(inputs["input_ids"], -100)
    rows = torch.arange(labels.shape[0])[:, None].expand_as(positions)
    keep = weights > 0
    labels[rows[keep], positions[keep]] = ids[keep]
    out = model(**inputs, labels=labels, next_sentence_label=nsp_labels)
    loss = out.loss
    logits = out.prediction_logits[rows, positions]  # B x P x V, for the sums only
    nsp_logits = out.seq_relationship_logits
  elif mlm_head == "masked":
    bert_out = model.bert(**inputs)
    hidden = bert_out.last_hidden_state
    gathered = torch.gather(hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.cls.predictions(gathered)
    nsp_logits = model.cls.seq_relationship(bert_out.pooler_output)
    loss = None
  else:
    raise ValueError(f"--mlm_head must be 'all' or 'masked', got {mlm_head!r}")
  xent = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten(), reduction="none")
  xent = xent.view_as(weights)
  nsp_xent = F.cross_entropy(nsp_logits.float(), nsp_labels, reduction="none")
  sums = dict(
    mlm_loss_sum=(xent * weights).sum(),
    mlm_correct=((logits.argmax(-1) == ids).float() * weights).sum(),
    mlm_weight=weights.sum(),
    nsp_loss_sum=nsp_xent.sum(),
    nsp_correct=(nsp_logits.argmax(-1) == nsp_labels).float().sum(),
    nsp_count=torch.tensor(float(nsp_labels.numel())),
  )
  if loss is None:
    loss = sums["mlm_loss_sum"] / (sums["mlm_weight"] + 1e-5) + nsp_xent.mean()
  return loss, sums


def _tensors(records: dict, index: np.ndarray, device: str = "cpu") -> dict:
  import torch  # optional (not a bert_jax dependency), heavy

  return {
    k: torch.from_numpy(np.ascontiguousarray(v[index])).to(device, non_blocking=True)
    for k, v in records.items()
  }


def _autocast(device: str, dtype: str):
  """Mixed precision as a PyTorch user runs it: ``torch.autocast`` in bfloat16 (parameters and
  optimizer state stay float32), or nothing in float32."""
  import torch  # optional (not a bert_jax dependency), heavy

  if dtype == "float32":
    return contextlib.nullcontext()
  return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def evaluate(
  model, records: dict, batch_size: int, mlm_head: str, device: str = "cpu", dtype: str = "float32"
) -> dict[str, float]:
  """Held-out MLM loss / accuracy (over the masked tokens) and NSP loss / accuracy."""
  import torch  # optional (not a bert_jax dependency), heavy

  model.eval()
  total: dict[str, float] = {}
  n = len(records["next_sentence_labels"])
  with torch.no_grad(), _autocast(device, dtype):
    for lo in range(0, n, batch_size):
      _, sums = loss_terms(
        model, _tensors(records, np.arange(lo, min(lo + batch_size, n)), device), mlm_head
      )
      for k, v in sums.items():
        total[k] = total.get(k, 0.0) + float(v)
  model.train()
  w, c = max(total["mlm_weight"], 1e-5), max(total["nsp_count"], 1.0)
  return dict(
    mlm_accuracy=total["mlm_correct"] / w,
    mlm_loss=total["mlm_loss_sum"] / w,
    mlm_perplexity=math.exp(min(total["mlm_loss_sum"] / w, 80.0)),
    nsp_accuracy=total["nsp_correct"] / c,
    nsp_loss=total["nsp_loss_sum"] / c,
  )


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--workdir", required=True, help="state.pt, history.json and hf/ go here")
  p.add_argument("--train_files", required=True, help="training TFRecords (globs)")
  p.add_argument("--eval_files", required=True, help="held-out TFRecords (globs)")
  p.add_argument("--vocab_file", required=True, help="vocab.txt (its size is the model's)")
  p.add_argument("--size", default="mini", help="bert_jax model preset")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--eval_batch_size", type=int, default=64)
  p.add_argument("--eval_records", type=int, default=0, help="the first N held-out (0: all)")
  p.add_argument("--learning_rate", type=float, default=5e-4)
  p.add_argument("--warmup_steps", type=int, default=1000)
  p.add_argument("--weight_decay", type=float, default=0.01)
  p.add_argument("--max_grad_norm", type=float, default=1.0)
  p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout")
  p.add_argument("--mlm_head", default="all", choices=("all", "masked"))
  p.add_argument("--budget_seconds", type=float, default=1800.0)
  p.add_argument("--eval_every_seconds", type=float, default=60.0)
  p.add_argument("--seed", type=int, default=42)
  p.add_argument(
    "--threads", type=int, default=0, help="torch threads (0: the cores this process may run on)"
  )
  p.add_argument("--device", default="auto", help="torch device (auto: cuda where available)")
  p.add_argument(
    "--dtype", default="float32", choices=("float32", "bfloat16"), help="autocast compute dtype"
  )
  return p


def _atomic_json(path: str, value) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def train(args) -> dict:
  """Runs (or resumes) the budgeted run; returns the final history dict."""
  t_process = time.time()
  import torch  # optional, heavy; after t_process: the run's clock counts its import

  torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)) or 1)  # as XLA sizes its pool
  os.makedirs(args.workdir, exist_ok=True)
  with open(args.vocab_file) as f:
    vocab_size = sum(1 for _ in f)
  train_data, eval_data = read_records(args.train_files), read_records(args.eval_files)
  if args.eval_records:
    eval_data = {k: v[: args.eval_records] for k, v in eval_data.items()}
  torch.manual_seed(args.seed)
  device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
  model = hf_model(args.size, vocab_size, args.dropout, args.dropout).to(device)
  optim = torch.optim.AdamW(
    param_groups(model, args.weight_decay), lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-6
  )
  warmup = max(args.warmup_steps, 0)
  sched = torch.optim.lr_scheduler.LambdaLR(
    optim, lambda s: min(1.0, s / warmup) if warmup else 1.0
  )
  state_path = os.path.join(args.workdir, "state.pt")
  st = dict(step=0, epoch=0, cursor=0, train_seconds=0.0, eval_seconds=0.0, tokens=0, history=[])
  if os.path.exists(state_path):
    saved = torch.load(state_path, weights_only=False, map_location=device)
    model.load_state_dict(saved["model"])
    optim.load_state_dict(saved["optim"])
    sched.load_state_dict(saved["sched"])
    torch.set_rng_state(saved["torch_rng"])
    st = saved["run"]
  n = len(train_data["next_sentence_labels"])
  order = np.random.default_rng([args.seed, st["epoch"]]).permutation(n)
  stop = {"flag": False}
  previous = {s: signal.signal(s, lambda *_: stop.update(flag=True)) for s in (2, 15)}

  def save():
    run = dict(st, budget_seconds=args.budget_seconds, mlm_head=args.mlm_head)
    torch.save(
      dict(
        model=model.state_dict(),
        optim=optim.state_dict(),
        sched=sched.state_dict(),
        torch_rng=torch.get_rng_state(),
        run=run,
      ),
      state_path + ".tmp",
    )
    os.replace(state_path + ".tmp", state_path)
    _atomic_json(os.path.join(args.workdir, "history.json"), run)

  def eval_and_save():
    t0 = time.time()
    metrics = evaluate(model, eval_data, args.eval_batch_size, args.mlm_head, device, args.dtype)
    st["history"].append(
      dict(step=st["step"], train_seconds=st["train_seconds"], tokens=st["tokens"], **metrics)
    )
    print(f"eval at step {st['step']} ({st['train_seconds']:.0f} s): {metrics}", flush=True)
    save()
    st["eval_seconds"] += time.time() - t0

  if st.get("completed"):
    return st
  model.train()
  clock = time.time()
  st["train_seconds"] += clock - t_process  # startup: imports, reading the records, the model
  every = args.eval_every_seconds
  next_eval = (math.floor(st["train_seconds"] / every) + 1) * every
  try:
    while st["train_seconds"] < args.budget_seconds and not stop["flag"]:
      if st["cursor"] + args.batch_size > n:
        st["epoch"], st["cursor"] = st["epoch"] + 1, 0
        order = np.random.default_rng([args.seed, st["epoch"]]).permutation(n)
      rows = order[st["cursor"] : st["cursor"] + args.batch_size]
      batch = _tensors(train_data, rows, device)
      st["cursor"] += args.batch_size
      with _autocast(device, args.dtype):
        loss, _ = loss_terms(model, batch, args.mlm_head)
      optim.zero_grad(set_to_none=True)
      loss.backward()
      if args.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
      optim.step()
      sched.step()
      st["step"] += 1
      st["tokens"] += int(train_data["input_mask"][rows].sum())  # host side: no device sync
      if st["step"] % 50 == 0 or device == "cpu":  # a GPU syncs at the log lines only
        value = float(loss.detach())
        if not math.isfinite(value):
          raise FloatingPointError(f"loss is {value} at step {st['step']}")
      now = time.time()
      st["train_seconds"] += now - clock
      clock = now
      if st["step"] % 50 == 0:
        print(f"step {st['step']} loss {value:.4f} {st['train_seconds']:.0f} s", flush=True)
      if st["train_seconds"] >= next_eval:
        eval_and_save()
        next_eval += args.eval_every_seconds
        clock = time.time()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  done = st["train_seconds"] >= args.budget_seconds
  if not st["history"] or st["history"][-1]["step"] != st["step"]:
    eval_and_save()
  st["completed"] = done
  save()
  if done:
    hf_dir = os.path.join(args.workdir, "hf")
    model.save_pretrained(hf_dir)
    with open(args.vocab_file) as src, open(os.path.join(hf_dir, "vocab.txt"), "w") as dst:
      dst.write(src.read())
  return st


def main(argv=None):
  args = _parser().parse_args(argv)
  st = train(args)
  print(json.dumps({k: v for k, v in st.items() if k != "history"}), flush=True)


if __name__ == "__main__":
  main()
