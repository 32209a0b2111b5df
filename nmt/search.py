"""Greedy and beam search over any ``Seq2Seq`` (through init_state / decode_step / reorder_state).

Conventions shared by both searches:
- Output lengths count generated tokens, the final EOS included; a sentence may use at most
  ``max_len`` decoding steps. A hypothesis without EOS by then is returned as it stands.
- Returned token ids carry neither BOS nor EOS.
- Scores are log-probabilities from a log_softmax in fp32, whatever dtype the model computes in;
  only the few that can matter per row are kept (``top_log_probs``).
- Both run under no_grad rather than inference_mode, so that autocast can cache its
  low-precision copy of each weight across steps (see ``Translator.translate_ids``).
- Sentences that are done leave the batch (``reorder_state`` with the surviving rows), so the
  late steps, when only long sentences remain, are cheap.
"""

from __future__ import annotations

import math

import torch

from nmt.loss import fp32_block_rows
from nmt.models.base import Seq2Seq


def max_output_lengths(src_mask: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """max_len = floor(a * src_len + b) per sentence, at least 1, where src_len counts the real
    source tokens except the final EOS. src_mask (B, S) -> (B,) long."""
    src_len = (src_mask.sum(dim=1) - 1).clamp(min=0).double()
    return torch.floor(a * src_len + b).long().clamp(min=1)


def top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(log_softmax(logits.float(), -1), k), computed by blocks of rows: logits (N, V)
    -> log-probabilities (N, k) fp32, best first, and their token ids (N, k).

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
        torch.topk(block, k, dim=-1, out=(values[a : a + rows], ids[a : a + rows]))
    return values, ids


def best_continuations(scores: torch.Tensor, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """The k best one-token continuations of each sentence's K beams, best first.

    scores (n, K) summed log-probabilities of the beams, logits (n*K, V) for their next token
    -> scores (n, k), beam (n, k) in 0..K-1, token (n, k): a topk over the n x K*V sums
    ``scores[:, :, None] + log_softmax(logits)``, but only each beam's own k best tokens are
    looked at, since a continuation in its sentence's best k is among its beam's best k.
    """
    n, K = scores.shape
    width = min(k, logits.shape[-1])
    lprobs, ids = top_log_probs(logits, width)  # (n*K, w)
    cand = (scores.reshape(-1, 1) + lprobs).view(n, K * width)
    top_scores, top_idx = cand.topk(min(k, K * width), dim=1)  # (n, k)
    return top_scores, top_idx // width, ids.view(n, K * width).gather(1, top_idx)


def _strip_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == eos_id else ids


@torch.no_grad()
def greedy_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: torch.Tensor | int,
    bos_id: int,
    eos_id: int,
) -> list[list[int]]:
    """Arg-max decoding: y_t = argmax_y log p(y | y_<t, x), until EOS or ``max_len`` steps.

    src, src_mask (B, S); max_len an int or a (B,) tensor of per-sentence limits.
    Returns B lists of token ids (without BOS/EOS).
    """
    B, device = src.shape[0], src.device
    limit = torch.as_tensor(max_len, device=device).long().expand(B).clone()  # (n,)
    state = model.init_state(model.encode(src, src_mask))
    alive = torch.arange(B, device=device)  # (n,) original sentence of each row
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=device)  # (n,)
    history = tokens.new_empty(B, 0)  # (n, t)
    out: list[list[int]] = [[] for _ in range(B)]
    for t in range(int(limit.max())):
        logits, state = model.decode_step(tokens, state)  # (n, V)
        tokens = logits.argmax(dim=-1)  # (n,): log_softmax keeps each row's order, no need to normalise
        history = torch.cat([history, tokens[:, None]], dim=1)
        done = (tokens == eos_id) | (limit <= t + 1)
        if not bool(done.any()):
            continue
        done_rows = done.nonzero().squeeze(1)
        for i, ids in zip(alive[done_rows].tolist(), history[done_rows].tolist()):
            out[i] = _strip_eos(ids, eos_id)
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        state = model.reorder_state(state, keep)
        alive, tokens, history, limit = alive[keep], tokens[keep], history[keep], limit[keep]
    return out


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: float,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    nbest: int = 1,
) -> list[list[tuple[list[int], float]]]:
    """Batched beam search; per sentence the ``nbest`` best (token ids, score), best first.

    The K = beam_size hypotheses of all n unfinished sentences form one batch of n*K rows.
    Each step, per sentence, the 2K best continuations of its K beams are taken
    (``best_continuations``); those among the best K that end in EOS are finished, the best K
    others stay alive.

    Score of a finished hypothesis y of |y| tokens (EOS included):
        score(y) = sum_t log p(y_t | y_<t, x) / |y| ** length_penalty
    A sentence is done when it has K finished hypotheses and its best alive one, scored as if
    it ended now (its current length), does not beat the K-th best finished one (exact for
    length_penalty 0, since log-probabilities only decrease), or when it reaches
    max_len = floor(a * src_len + b) steps: its alive hypotheses then join the finished ones,
    scored by their own length. beam_size 1 reproduces ``greedy_search``. ``pad_id`` is unused
    (kept for a uniform signature: hypotheses are lists, never padded).
    """
    del pad_id
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest {nbest} must be between 1 and beam_size {beam_size}")
    B, K, device = src.shape[0], beam_size, src.device
    state = model.init_state(model.encode(src, src_mask))
    state = model.reorder_state(state, torch.arange(B, device=device).repeat_interleave(K))  # n*K rows

    limit = max_output_lengths(src_mask, max_len_a, max_len_b)  # (n,)
    sent = list(range(B))  # original index of each unfinished sentence
    scores = torch.full((B, K), -math.inf, device=device)  # (n, K) summed log-probs of alive beams
    scores[:, 0] = 0.0  # all beams start identical: let only the first one expand at step 0
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=device)  # (n*K,) last token
    history = tokens.new_empty(B * K, 0)  # (n*K, t) tokens so far
    bar = torch.full((B,), -math.inf, device=device)  # (n,) K-th best finished score; -inf while < K
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    results: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]
    cand_rank = torch.arange(2 * K, device=device)  # (2K,)

    t = 0
    while sent:
        n = len(sent)
        logits, state = model.decode_step(tokens, state)  # (n*K, V)
        top_scores, top_beam, top_tok = best_continuations(scores, logits, 2 * K)  # (n, 2K), best first
        base = torch.arange(n, device=device)[:, None] * K  # (n, 1) first row of each sentence
        norm = float(t + 1) ** length_penalty

        # Finish: EOS among the best K candidates.
        is_eos = top_tok == eos_id  # (n, 2K)
        norm_scores = top_scores[:, :K] / norm  # (n, K)
        hits = (is_eos[:, :K] & (top_scores[:, :K] > -math.inf)).nonzero()  # (h, 2): sentence, rank
        if hits.numel():
            hit_rows = (base[:, 0][hits[:, 0]] + top_beam[hits[:, 0], hits[:, 1]]).tolist()
            hit_scores = norm_scores[hits[:, 0], hits[:, 1]].tolist()
            hit_sents = hits[:, 0].tolist()
            for i, row, score in zip(hit_sents, hit_rows, hit_scores):
                finished[sent[i]].append((score, history[row].tolist()))
            for i in set(hit_sents):
                kept = sorted((s for s, _ in finished[sent[i]]), reverse=True)
                if len(kept) >= K:
                    bar[i] = kept[K - 1]

        # Continue: the best K candidates that are not EOS (stable: EOS ranks after all others).
        pick = (is_eos.long() * (2 * K) + cand_rank[: is_eos.shape[1]]).topk(K, dim=1, largest=False).indices
        scores = top_scores.gather(1, pick)  # (n, K)
        rows = (base + top_beam.gather(1, pick)).view(-1)  # (n*K,) parent row of each new beam
        tokens = top_tok.gather(1, pick).view(-1)
        history = torch.cat([history.index_select(0, rows), tokens[:, None]], dim=1)

        at_limit = limit <= t + 1  # (n,)
        done = at_limit | (scores[:, 0] / norm <= bar)
        if bool(done.any()):
            for i in done.nonzero().squeeze(1).tolist():
                hyps = finished[sent[i]]
                if at_limit[i]:
                    alive_scores = (scores[i] / norm).tolist()
                    alive_ids = history[i * K : (i + 1) * K].tolist()
                    hyps += [(s, ids) for s, ids in zip(alive_scores, alive_ids) if s > -math.inf]
                hyps.sort(key=lambda h: -h[0])  # stable: among equal scores, finished ones first
                results[sent[i]] = [(_strip_eos(ids, eos_id), s) for s, ids in hyps[:nbest]]
                finished[sent[i]] = []
            keep = (~done).nonzero().squeeze(1)  # (n',)
            sent = [sent[i] for i in keep.tolist()]
            rows = rows.view(n, K)[keep].view(-1)
            scores, bar, limit = scores[keep], bar[keep], limit[keep]
            tokens = tokens.view(n, K)[keep].view(-1)
            history = history.view(n, K, -1)[keep].flatten(0, 1)
        if sent:
            state = model.reorder_state(state, rows)
        t += 1
    return results
