"""Pre-training instances from tokenized documents: BERT appendix A.1/A.2, matching
google-research/bert's `create_instances_from_document` step for step:

* target length = max_seq_length - 3, or with probability `short_seq_prob` a uniform integer in
  [2, max_seq_length - 3];
* sentences are gathered into a chunk until the chunk reaches the target (or the document ends);
  segment A is the first `a_end` sentences of the chunk (`a_end` uniform in [1, len(chunk) - 1]);
* B is the rest of the chunk with probability 0.5 (and when the chunk has >1 sentence), else a
  run of sentences from a random start in a random *other* document of the same shard
  (up to 10 draws to avoid the current one), and the chunk's unused sentences go back to be
  read again;
* the pair is truncated to max_seq_length - 3 tokens by repeatedly dropping a token from the
  front or the back (coin flip) of the longer segment;
* tokens are `[CLS] A [SEP] B [SEP]`, segment ids 0 for `[CLS] A [SEP]` and 1 for `B [SEP]`.

Without sentence pairs (`sentence_pairs=False`: the paper's "No NSP" and "LTR & No NSP"
ablations, Table 5), `packed_instances` packs the shard's documents instead, RoBERTa's
FULL-SENTENCES: the documents' sentences, in order, fill segments of up to max_seq_length - 2
tokens greedily (`[CLS] tokens [SEP]`, segment ids all 0, next_sentence_label 0); a segment runs
on into the next document, with a [SEP] token between the two documents (a separator that would
start a segment is dropped: the segment boundary separates them); a sentence longer than what is
left of the segment starts the next one, and a sentence longer than a whole segment is cut into
segment-sized pieces. As in the pairs' procedure, with probability `short_seq_prob` a segment's
target length is a uniform integer in [2, max_seq_length - 2] instead.

Masking (`masking.mask_tokens`, with its `MaskRates`) is the same for both.
"""

import dataclasses
import random

from bert_jax.data import masking


@dataclasses.dataclass
class Instance:
  input_ids: list[int]
  segment_ids: list[int]
  masked_positions: list[int]
  masked_ids: list[int]
  is_random_next: bool
  short_target: bool  # Whether its document pass drew a short target length (statistics).
  chunk_sentences: int  # Sentences in the chunk A (and a real B) came from (statistics).
  # Packed (single-segment) instances: the target length of the segment (0 for pairs).
  target_length: int = 0


def _truncate_pair(
  a: list[int], b: list[int], max_num_tokens: int, rng: random.Random
) -> tuple[list[int], list[int]]:
  """The original's truncate_seq_pair, O(n) (index bookkeeping instead of list deletion)."""
  a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
  while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
    if (a_hi - a_lo) > (b_hi - b_lo):
      if rng.random() < 0.5:
        a_lo += 1
      else:
        a_hi -= 1
    else:
      if rng.random() < 0.5:
        b_lo += 1
      else:
        b_hi -= 1
  return a[a_lo:a_hi], b[b_lo:b_hi]


def instances_from_document(
  documents: list[list[list[int]]],
  document_index: int,
  max_seq_length: int,
  short_seq_prob: float,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  spec: masking.MaskingSpec,
  whole_word_mask: bool,
  rng: random.Random,
  rates: masking.MaskRates = masking.MaskRates(),
) -> list[Instance]:
  """All instances of one document (a list of tokenized sentences) of a shard."""
  document = documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  short_target = False
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
    short_target = True

  instances = []
  chunk: list[list[int]] = []
  chunk_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    chunk.append(segment)
    chunk_length += len(segment)
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      if chunk:
        a_end = 1
        if len(chunk) >= 2:
          a_end = rng.randint(1, len(chunk) - 1)
        tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
        tokens_b: list[int] = []
        if len(chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          random_index = document_index
          for _ in range(10):
            random_index = rng.randint(0, len(documents) - 1)
            if random_index != document_index:
              break
          random_document = documents[random_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          i -= len(chunk) - a_end  # The unused sentences go back.
        else:
          is_random_next = False
          tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
        tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
        if tokens_a and tokens_b:
          ids = [spec.cls_id] + tokens_a + [spec.sep_id] + tokens_b + [spec.sep_id]
          segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
          masked, positions, labels = masking.mask_tokens(
            ids, spec, masked_lm_prob, max_predictions_per_seq, whole_word_mask, rng, rates
          )
          instances.append(
            Instance(
              masked, segment_ids, positions, labels, is_random_next, short_target, len(chunk)
            )
          )
      chunk = []
      chunk_length = 0
    i += 1
  return instances


def packed_instances(
  documents: list[list[list[int]]],
  max_seq_length: int,
  short_seq_prob: float,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  spec: masking.MaskingSpec,
  whole_word_mask: bool,
  rng: random.Random,
  rates: masking.MaskRates = masking.MaskRates(),
) -> list[Instance]:
  """One pass of single-segment instances over `documents`, in order (see the module docstring).

  Each segment draws its target length when it starts: max_seq_length - 2, or with probability
  `short_seq_prob` a uniform integer in [2, max_seq_length - 2].
  """
  max_num_tokens = max_seq_length - 2
  if max_num_tokens < 2:
    raise ValueError(f"max_seq_length must be >= 4 for packed segments, got {max_seq_length}")
  instances: list[Instance] = []
  segment: list[int] = []
  pieces = 0  # Sentences (or pieces of one) in the segment (statistics).
  target = max_num_tokens
  short = False

  def new_target():
    nonlocal target, short
    short = rng.random() < short_seq_prob
    target = rng.randint(2, max_num_tokens) if short else max_num_tokens

  def emit():
    nonlocal segment, pieces
    ids = [spec.cls_id] + segment + [spec.sep_id]
    masked, positions, labels = masking.mask_tokens(
      ids, spec, masked_lm_prob, max_predictions_per_seq, whole_word_mask, rng, rates
    )
    instances.append(
      Instance(masked, [0] * len(ids), positions, labels, False, short, pieces, target)
    )
    segment, pieces = [], 0
    new_target()

  new_target()
  for d, document in enumerate(documents):
    if d and segment:  # The separator between documents (dropped at a segment start).
      if len(segment) < target:
        segment.append(spec.sep_id)
      else:
        emit()
    for sentence in document:
      rest = sentence
      while rest:
        room = target - len(segment)
        if len(rest) <= room:
          segment.extend(rest)
          pieces += 1
          rest = []
        elif segment:
          emit()  # The sentence starts the next segment.
        else:
          segment.extend(rest[:room])  # Longer than a whole segment: a segment-sized piece.
          pieces += 1
          rest = rest[room:]
          emit()
  if segment:
    emit()
  return instances


def instances_from_documents(
  documents: list[list[list[int]]],
  max_seq_length: int,
  dupe_factor: int,
  short_seq_prob: float,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  spec: masking.MaskingSpec,
  whole_word_mask: bool,
  rng: random.Random,
  rates: masking.MaskRates = masking.MaskRates(),
  sentence_pairs: bool = True,
) -> list[Instance]:
  """The original's create_training_instances after reading: shuffle the documents, make
  `dupe_factor` passes (fresh masks and pairings each), shuffle the instances.

  `sentence_pairs=False`: each pass packs the (shuffled) documents into single segments
  (`packed_instances`) instead of making NSP pairs.
  """
  if max_seq_length < 5:
    raise ValueError(
      f"max_seq_length must be >= 5 (room for [CLS] A [SEP] B [SEP]), got {max_seq_length}"
    )
  documents = [d for d in documents if d]
  rng.shuffle(documents)
  instances = []
  for _ in range(dupe_factor):
    if not sentence_pairs:
      instances.extend(
        packed_instances(
          documents,
          max_seq_length,
          short_seq_prob,
          masked_lm_prob,
          max_predictions_per_seq,
          spec,
          whole_word_mask,
          rng,
          rates,
        )
      )
      continue
    for index in range(len(documents)):
      instances.extend(
        instances_from_document(
          documents,
          index,
          max_seq_length,
          short_seq_prob,
          masked_lm_prob,
          max_predictions_per_seq,
          spec,
          whole_word_mask,
          rng,
          rates,
        )
      )
  rng.shuffle(instances)
  return instances
