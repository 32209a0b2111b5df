"""Greedy and beam search over any ``Seq2Seq`` (through init_state / decode_step / reorder_state).

Conventions shared by both searches:
- Both take the same per-sentence limit ``max_len`` (``max_output_lengths``): a sentence may use
  at most that many decoding steps, the final EOS included. A hypothesis without EOS by then is
  returned as it stands.
- They return ``Hypothesis`` objects: token ids without BOS or EOS, the summed log-probability
  and the number of steps taken.
- Scores are log-probabilities from a log_softmax in fp32, whatever dtype the model computes in;
  only the few that can matter per row are kept (``top_log_probs``). PAD and BOS are never
  emitted (their log-probability is set to -inf after the softmax, so the others' are unchanged):
  an undertrained model may rank them first, and neither is text.
- Both run under no_grad rather than inference_mode, so that autocast can cache its
  low-precision copy of each weight across steps (see ``Translator.translate_ids``).
- Sentences that are done leave the batch (``reorder_state`` with the surviving rows), so the
  late steps, when only long sentences remain, are cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nmt.loss import fp32_block_rows
from nmt.models.base import Seq2Seq


@dataclass
class Hypothesis:
    """One output sentence of a search."""

    tokens: list[int]  # without BOS and EOS
    log_prob: float  # sum over the steps of log p(y_t | y_<t, x), the EOS step included
    steps: int  # decoding steps taken: len(tokens) + 1 when it ended with EOS
    attention: torch.Tensor | None = None  # (steps, layers, heads, S) fp32 weights over the padded source

    def score(self, length_penalty: float) -> float:
        """The length-normalised score beam search ranks by: log_prob / steps ** length_penalty."""
        return self.log_prob / self.steps**length_penalty


MAX_STEPS = 1 << 31  # the limit of a model without positions: a huge a * src + b must still fit an int64


def max_output_lengths(src_mask: torch.Tensor, a: float, b: float, max_positions: int | None = None) -> torch.Tensor:
    """max_len = floor(a * src_len + b) per sentence, at least 1 and at most ``max_positions`` (the
    decoder's positions: step t reads position t; as fairseq's min(a * src + b, max positions)),
    where src_len counts the real source tokens except the final EOS. src_mask (B, S) -> (B,) long."""
    src_len = (src_mask.sum(dim=1) - 1).clamp(min=0).double()
    upper = MAX_STEPS if max_positions is None else min(max_positions, MAX_STEPS)
    return torch.floor(a * src_len + b).clamp(min=1, max=upper).long()


def top_log_probs(logits: torch.Tensor, k: int, never: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(log_softmax(logits.float(), -1), k), computed by blocks of rows: logits (N, V)
    -> log-probabilities (N, k) fp32, best first, and their token ids (N, k); the ids in ``never``
    get -inf (chosen only where a row has fewer than k others).

    The same kernels on the same rows, so the same values; but on CPU each block's fp32
    log-probabilities (~2 MB) stay in cache and only k per row are kept. Building the whole (N, V)
    fp32 tensor (47 MB for 1,500 beams over 8k words) and adding the beam scores to it cost more
    than the output projection itself, much of it in page faults on fresh memory. A GPU takes
    blocks of up to 256 MB (see ``fp32_block_rows``).
    """
    N, V = logits.shape
    rows = fp32_block_rows(V, logits.device.type)
    values = torch.empty(N, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(N, k, dtype=torch.long, device=logits.device)
    for a in range(0, N, rows):
        block = torch.log_softmax(logits[a : a + rows], dim=-1, dtype=torch.float32)  # (rows, V)
        for token in never:
            block[:, token] = -math.inf
        torch.topk(block, k, dim=-1, out=(values[a : a + rows], ids[a : a + rows]))
    return values, ids


def best_continuations(
    scores: torch.Tensor, logits: torch.Tensor, k: int, never: tuple[int, ...] = ()
) -> tuple[torch.Tensor, ...]:
    """The k best one-token continuations of each sentence's K beams, best first.

    scores (n, K) summed log-probabilities of the beams, logits (n*K, V) for their next token
    -> scores (n, k), beam (n, k) in 0..K-1, token (n, k): a topk over the n x K*V sums
    ``scores[:, :, None] + log_softmax(logits)``, but only each beam's own k best tokens are
    looked at, since a continuation in its sentence's best k is among its beam's best k.
    """
    n, K = scores.shape
    width = min(k, logits.shape[-1])
    lprobs, ids = top_log_probs(logits, width, never)  # (n*K, w)
    cand = (scores.reshape(-1, 1) + lprobs).view(n, K * width)
    if K * width < k:  # fewer candidates than asked (one beam over a tiny vocabulary): pad with dead ones
        cand = F.pad(cand, (0, k - K * width), value=-math.inf)
        ids = F.pad(ids.view(n, K * width), (0, k - K * width))
    top_scores, top_idx = cand.topk(k, dim=1)  # (n, k)
    beam = (top_idx // width).clamp(max=K - 1)  # a padded candidate names a real (dead-end) parent
    return top_scores, beam, ids.view(n, -1).gather(1, top_idx)


def _hypothesis(ids: list[int], log_prob: float, eos_id: int, attention: torch.Tensor | None = None) -> Hypothesis:
    """``ids`` as generated (EOS last if it ended) -> a Hypothesis without the EOS."""
    ended = bool(ids) and ids[-1] == eos_id
    return Hypothesis(ids[:-1] if ended else ids, log_prob, len(ids), attention)


def _init_state(model: Seq2Seq, src: torch.Tensor, src_mask: torch.Tensor, attention: bool):
    memory = model.encode(src, src_mask)
    return model.init_state(memory, record_attention=True) if attention else model.init_state(memory)


def _grow(history: torch.Tensor | None, rows: torch.Tensor | None, step: torch.Tensor | None) -> torch.Tensor | None:
    """Attention history (N, t, ...) of the rows continued, with this step's weights (N', ...) appended."""
    if step is None:
        return None
    if rows is not None:
        step = step.index_select(0, rows)
        history = history.index_select(0, rows) if history is not None else None
    step = step[:, None].float()
    return step if history is None else torch.cat([history, step], dim=1)


# ---------------------------------------------------------------------------- greedy


@torch.no_grad()
def greedy_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    bos_id: int,
    eos_id: int,
    attention: bool = False,
) -> list[Hypothesis]:
    """Arg-max decoding: y_t = argmax_y log p(y | y_<t, x), until EOS or ``max_len`` steps.

    src, src_mask (B, S); max_len (B,) per-sentence step limits (``max_output_lengths``). With
    ``attention``, each hypothesis carries the weights over the source of every step.
    """
    B, device = src.shape[0], src.device
    limit = max_len.to(device).long()  # (n,)
    state = _init_state(model, src, src_mask, attention)
    weights = None  # (n, t, L, H, S) with attention
    alive = torch.arange(B, device=device)  # (n,) original sentence of each row
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=device)  # (n,)
    log_prob = torch.zeros(B, device=device)  # (n,)
    history = tokens.new_empty(B, 0)  # (n, t)
    out: list[Hypothesis | None] = [None] * B
    for t in range(int(limit.max())):
        logits, state = model.decode_step(tokens, state)  # (n, V)
        weights = _grow(weights, None, model.step_attention(state))
        best, ids = top_log_probs(logits, 1, (model.pad_id, bos_id))  # (n, 1): the arg-max and its log-probability
        tokens = ids[:, 0]
        log_prob += best[:, 0]
        history = torch.cat([history, tokens[:, None]], dim=1)
        done = (tokens == eos_id) | (limit <= t + 1)
        if not bool(done.any()):
            continue
        done_rows = done.nonzero().squeeze(1)
        for j, (i, ids_, lp) in enumerate(
            zip(alive[done_rows].tolist(), history[done_rows].tolist(), log_prob[done_rows].tolist())
        ):
            out[i] = _hypothesis(ids_, lp, eos_id, None if weights is None else weights[done_rows[j]].cpu())
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        state = model.reorder_state(state, keep)
        alive, tokens, history, limit, log_prob = (x[keep] for x in (alive, tokens, history, limit, log_prob))
        weights = None if weights is None else weights[keep]
    return out  # type: ignore[return-value]  # every sentence finished by its limit


# ---------------------------------------------------------------------------- beam


@dataclass
class _Beams:
    """The K alive hypotheses of each of the n unfinished sentences, as one batch of n*K rows
    (K = 1 before the first step: a sentence's beams all start from BOS alone)."""

    sentence: list[int]  # (n,) original index of each unfinished sentence
    scores: torch.Tensor  # (n, K) summed log-probabilities; -inf for a dead end (fewer words than beams)
    tokens: torch.Tensor  # (n*K,) last token of each beam
    history: torch.Tensor  # (n*K, t) tokens so far
    limit: torch.Tensor  # (n,) step limit of each sentence
    bar: torch.Tensor  # (n,) K-th best finished normalised score; -inf while fewer than K have finished
    state: object  # the model's decoder state, n*K rows
    attention: torch.Tensor | None = None  # (n*K, t, L, H, S) weights of every step so far, if recorded


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    bos_id: int,
    eos_id: int,
    nbest: int = 1,
    attention: bool = False,
) -> list[list[Hypothesis]]:
    """Batched beam search; per sentence its ``nbest`` best hypotheses, best first (with
    ``attention``, each carries the weights over the source of every step, reordered with its beam).

    Each step, per sentence (Koehn, "Statistical Machine Translation", ch. 6; Wu et al., 2016):
      1. expand: score every continuation y of every alive beam h: score(h) + log p(y | h, x),
         and keep the sentence's 2K best (``best_continuations``);
      2. finish: those among the best K that end in EOS become finished hypotheses, ranked by
         score(y) = sum_t log p(y_t | y_<t, x) / |y| ** length_penalty, |y| counting the EOS;
      3. prune: the best K others are the new alive beams;
      4. stop: a sentence is done when it has K finished hypotheses and its best alive beam's
         score so far, log p / (t + 1) ** length_penalty over its t + 1 tokens (as if it ended
         now), is at most the K-th best finished score; or when it reaches its ``max_len``
         steps: its alive beams then join the finished ones as they stand.
    The stopping rule of step 4 is exact only for length_penalty 0: a continuation only loses
    log-probability, so none can beat the K-th finished, and the n-best are those the same search
    would return if it ran every sentence to its max_len. With length_penalty > 0 it is a
    heuristic: a longer continuation's log p is divided by a larger length ** length_penalty and
    can still beat the K-th finished, so the search may stop before a better-scoring hypothesis
    (a bound that never does, log p / max_len ** length_penalty, would take nearly every
    sentence to its max_len). Done sentences leave the batch. beam_size 1 reproduces ``greedy_search``.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest {nbest} must be between 1 and beam_size {beam_size}")
    B, K, device = src.shape[0], beam_size, src.device
    state = _init_state(model, src, src_mask, attention)
    # Step 0 starts from one beam per sentence (K identical ones would compute the same thing K
    # times); pruning after it gives each sentence its K beams.
    beams = _Beams(
        sentence=list(range(B)),
        scores=torch.zeros(B, 1, device=device),
        tokens=torch.full((B,), bos_id, dtype=torch.long, device=device),
        history=torch.empty(B, 0, dtype=torch.long, device=device),
        limit=max_len.to(device).long(),
        bar=torch.full((B,), -math.inf, device=device),
        state=state,
    )
    finished: list[list[tuple]] = [[] for _ in range(B)]  # (normalised score, log p, ids, attention)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    t = 0
    while beams.sentence:
        logits, beams.state = model.decode_step(beams.tokens, beams.state)  # (n*K, V)
        step_attention = model.step_attention(beams.state)  # (n*K, L, H, S) or None
        top_scores, top_beam, top_tok = best_continuations(beams.scores, logits, 2 * K, (model.pad_id, bos_id))
        norm = float(t + 1) ** length_penalty
        _finish(beams, finished, top_scores, top_beam, top_tok, norm, K, eos_id, step_attention)
        rows = _prune(beams, top_scores, top_beam, top_tok, K, eos_id)
        beams.attention = _grow(beams.attention, rows, step_attention)
        rows = _retire_done(beams, finished, results, rows, t, norm, K, nbest, eos_id)
        if beams.sentence:
            beams.state = model.reorder_state(beams.state, rows)
        t += 1
    return results


def _finish(
    beams: _Beams, finished: list, top_scores, top_beam, top_tok, norm: float, K: int, eos_id: int, step_attention
) -> None:
    """Step 2: candidates among each sentence's best K that end in EOS join its finished list."""
    is_eos = top_tok[:, :K] == eos_id  # (n, K)
    hits = (is_eos & (top_scores[:, :K] > -math.inf)).nonzero()  # (h, 2): sentence, rank
    if not hits.numel():
        return
    alive = beams.scores.shape[1]  # beams per sentence in this step: 1 at step 0, then K
    first_row = torch.arange(len(beams.sentence), device=top_tok.device) * alive  # (n,)
    rows = (first_row[hits[:, 0]] + top_beam[hits[:, 0], hits[:, 1]]).tolist()
    log_probs = top_scores[hits[:, 0], hits[:, 1]].tolist()
    sentences = hits[:, 0].tolist()
    for i, row, lp in zip(sentences, rows, log_probs):
        weights = None
        if step_attention is not None:
            index = torch.tensor([row], device=top_tok.device)
            weights = _grow(beams.attention, index, step_attention)[0].cpu()
        finished[beams.sentence[i]].append((lp / norm, lp, beams.history[row].tolist() + [eos_id], weights))
    for i in set(sentences):
        kept = sorted((h[0] for h in finished[beams.sentence[i]]), reverse=True)
        if len(kept) >= K:
            beams.bar[i] = kept[K - 1]


def _prune(beams: _Beams, top_scores, top_beam, top_tok, K: int, eos_id: int) -> torch.Tensor:
    """Step 3: the best K candidates that do not end in EOS become the alive beams (stable: EOS
    ranks after all others). Returns the parent row of each new beam, (n*K,)."""
    n, width = top_tok.shape
    rank = torch.arange(width, device=top_tok.device)
    pick = ((top_tok == eos_id).long() * width + rank).topk(K, dim=1, largest=False).indices  # (n, K)
    alive = beams.scores.shape[1]  # parents per sentence: 1 at step 0, then K
    first_row = torch.arange(n, device=top_tok.device)[:, None] * alive  # (n, 1)
    rows = (first_row + top_beam.gather(1, pick)).view(-1)
    beams.scores = top_scores.gather(1, pick)
    beams.tokens = top_tok.gather(1, pick).view(-1)
    beams.history = torch.cat([beams.history.index_select(0, rows), beams.tokens[:, None]], dim=1)
    return rows


def _retire_done(
    beams: _Beams, finished: list, results: list, rows: torch.Tensor, t: int, norm: float, K: int, nbest: int, eos_id
) -> torch.Tensor:
    """Step 4: sentences that are done leave the batch with their ``nbest`` best hypotheses.
    Returns the rows of the decoder state the remaining beams continue."""
    n = len(beams.sentence)
    at_limit = beams.limit <= t + 1  # (n,)
    # The best alive beam (column 0: beams share a length, so best log p is best score), scored
    # over its length so far: a bound on its continuations for length_penalty 0 only (see beam_search).
    done = at_limit | (beams.scores[:, 0] / norm <= beams.bar)
    if not bool(done.any()):
        return rows
    for i in done.nonzero().squeeze(1).tolist():
        hyps = finished[beams.sentence[i]]
        if at_limit[i]:
            alive_log_probs = beams.scores[i].tolist()
            alive_ids = beams.history[i * K : (i + 1) * K].tolist()
            alive_weights = [None] * K if beams.attention is None else beams.attention[i * K : (i + 1) * K].cpu()
            hyps += [
                (lp / norm, lp, ids, w)
                for lp, ids, w in zip(alive_log_probs, alive_ids, alive_weights)
                if lp > -math.inf
            ]
        hyps.sort(key=lambda h: -h[0])  # stable: among equal scores, finished ones first
        results[beams.sentence[i]] = [_hypothesis(ids, lp, eos_id, w) for _, lp, ids, w in hyps[:nbest]]
        finished[beams.sentence[i]] = []
    keep = (~done).nonzero().squeeze(1)  # (n',)
    beams.sentence = [beams.sentence[i] for i in keep.tolist()]
    beams.scores, beams.bar, beams.limit = beams.scores[keep], beams.bar[keep], beams.limit[keep]
    beams.tokens = beams.tokens.view(n, K)[keep].view(-1)
    beams.history = beams.history.view(n, K, -1)[keep].flatten(0, 1)
    if beams.attention is not None:
        beams.attention = beams.attention.view(n, K, *beams.attention.shape[1:])[keep].flatten(0, 1)
    return rows.view(n, K)[keep].view(-1)
