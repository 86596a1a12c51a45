"""Fine-tuning steps against Hugging Face PyTorch: same MiniLM weights, head, batches and recipe.

With dropout off, bert_jax's jitted train step (task loss, gradients, global-norm clipping,
AdamW with BERT's weight-decay exclusions, warmup then linear decay) must follow the same
trajectory as a plain PyTorch loop over ``transformers.BertForSequenceClassification``: the
loss at every step and the parameters after the last one. STS-B exercises the regression head
(mean squared error), MRPC the 2-way softmax cross-entropy.
"""

import dataclasses

import numpy as np
import pytest

STEPS, BATCH, WARMUP, LR = 6, 8, 2, 1e-4


def _bert_schedule(step):
  """google-research/bert's learning rate: linear warmup, then linear decay to 0 at STEPS."""
  return step / WARMUP if step < WARMUP else 1.0 - step / STEPS


def _torch_steps(minilm_dir, num_labels, classifier, batches):
  import torch
  import transformers

  model = transformers.BertForSequenceClassification.from_pretrained(
    str(minilm_dir),
    num_labels=num_labels,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  )
  with torch.no_grad():
    model.classifier.weight.copy_(torch.as_tensor(classifier["kernel"].T))
    model.classifier.bias.copy_(torch.as_tensor(classifier["bias"]))
  no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
  decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=LR,
    betas=(0.9, 0.999),
    eps=1e-6,
  )
  sched = torch.optim.lr_scheduler.LambdaLR(opt, _bert_schedule)
  model.train()
  losses = []
  for b in batches:
    label = torch.as_tensor(b["label"])
    out = model(
      input_ids=torch.as_tensor(b["input_ids"]).long(),
      attention_mask=torch.as_tensor(b["input_mask"]).long(),
      token_type_ids=torch.as_tensor(b["segment_ids"]).long(),
      labels=label.float() if num_labels == 1 else label.long(),
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(out.loss.item())
  named = dict(model.named_parameters())
  return losses, {
    k: named[k].detach().numpy()
    for k in ("classifier.weight", "bert.pooler.dense.weight", "bert.embeddings.LayerNorm.weight")
  }


@pytest.mark.parametrize("task_name", ["stsb", "mrpc"])
def test_train_steps_follow_pytorch(task_name, shared_data, minilm_dir):
  import jax
  import jax.numpy as jnp
  import torch
  import transformers

  from bert_jax.formats import load_pretrained
  from bert_jax.runs.finetuning import runner
  from bert_jax.tasks import create_task
  from bert_jax.train import optimizers, train_step
  from bert_jax.train.state import TrainState
  from configs import glue

  c = glue.get_config(task_name)
  c.data_dir, c.max_seq_length, c.max_train_examples = (
    str(shared_data / "glue"),
    64,
    STEPS * BATCH,
  )
  pre = load_pretrained(str(minilm_dir))
  task = create_task(c, pre.tokenizer)
  train = task.load_split("train")
  batches = [
    {k: v[i * BATCH : (i + 1) * BATCH] for k, v in train.arrays.items()} for i in range(STEPS)
  ]
  num_labels = 1 if task_name == "stsb" else 2
  torch.manual_seed(0)
  head = transformers.BertForSequenceClassification.from_pretrained(
    str(minilm_dir), num_labels=num_labels
  ).classifier
  classifier = {
    "kernel": head.weight.detach().numpy().T.copy(),
    "bias": head.bias.detach().numpy().copy(),
  }
  ref_losses, ref_params = _torch_steps(minilm_dir, num_labels, classifier, batches)

  bert_config = dataclasses.replace(
    pre.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
  )
  model = task.build_model(bert_config)
  params = jax.tree_util.tree_map(
    jnp.asarray, {"bert": pre.params["bert"], "classifier": classifier}
  )
  schedule = optimizers.warmup_linear_decay(LR, WARMUP, STEPS)
  tx = optimizers.create_optimizer(c.optimizer, schedule)
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.key_data(jax.random.PRNGKey(0)),
  )
  step = jax.jit(train_step.make_train_step(runner.make_loss_fn(task, model), tx, schedule))
  losses = []
  for b in batches:
    state, metrics = step(state, jax.tree_util.tree_map(jnp.asarray, b))
    losses.append(float(metrics["loss"]))

  # The loss moves (the learning rate is large enough to matter) and follows PyTorch's.
  assert abs(losses[-1] - losses[0]) > 1e-3
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-5)
  ours = jax.device_get(state.params)
  pairs = {
    "classifier.weight": ours["classifier"]["kernel"].T,
    "bert.pooler.dense.weight": ours["bert"]["pooler"]["kernel"].T,
    "bert.embeddings.LayerNorm.weight": ours["bert"]["embeddings"]["LayerNorm"]["scale"],
  }
  for name, value in pairs.items():  # Adam moves each weight by up to ~LR per step
    np.testing.assert_allclose(value, ref_params[name], atol=LR * STEPS / 20, rtol=0, err_msg=name)
  assert np.abs(pairs["classifier.weight"] - classifier["kernel"].T).max() > LR  # it moved
