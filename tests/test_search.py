"""Greedy and beam search on random Transformers and on a hand-made oracle model."""

import itertools
import math
from dataclasses import replace

import pytest
import torch

from nmt.models.base import Seq2Seq
from nmt.models.rnn import RNNConfig, RNNSeq2Seq
from nmt.models.transformer import Transformer, TransformerConfig
from nmt.search import (
    MAX_STEPS,
    Hypothesis,
    beam_search,
    best_continuations,
    greedy_search,
    max_output_lengths,
    top_log_probs,
)

PAD, BOS, EOS, V = 0, 1, 2, 17


class EosBiased(Transformer):
    """A random Transformer with a bias on the EOS logit, so hypotheses end at varied lengths."""

    eos_bias = 0.0

    def project(self, h):
        logits = super().project(h)
        return logits + torch.nn.functional.one_hot(torch.tensor(EOS), V).to(logits.dtype) * self.eos_bias


def make(seed, eos_bias=1.5):
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=2, decoder_layers=2, heads=4, dropout=0.0)
    model = EosBiased(cfg, V, V, PAD).eval()
    model.eos_bias = eos_bias
    return model


def sources(seed, lengths=(6, 3, 9, 4)):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    src = torch.full((len(lengths), S), PAD)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(3, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src, src != PAD


def sequence_logprob(model, src, mask, ids, finished):
    """Teacher-forced rescoring: sum_t log p(y_t | y_<t, x), EOS included if the hypothesis ended."""
    y = ids + [EOS] if finished else ids
    trg_in = torch.tensor([[BOS] + y[:-1]])
    with torch.no_grad():
        lprobs = torch.log_softmax(model(src, mask, trg_in).float(), dim=-1)[0]
    return sum(lprobs[t, tok].item() for t, tok in enumerate(y))


def beam(model, src, mask, k, lp=1.0, a=1.2, b=4, nbest=1):
    """(tokens, length-normalised score) of each sentence's n best."""
    out = beam_search(model, src, mask, max_output_lengths(mask, a, b), k, lp, BOS, EOS, nbest=nbest)
    return [[(h.tokens, h.score(lp)) for h in hyps] for hyps in out]


def greedy_tokens(model, src, mask, limits):
    return [h.tokens for h in greedy_search(model, src, mask, torch.as_tensor(limits).expand(src.shape[0]), BOS, EOS)]


def test_beam_size_one_is_greedy():
    lengths = []  # (greedy length, limit) over all runs: both EOS-ended and truncated must occur
    for seed in range(5):
        for eos_bias in (1.5, 2.5):
            model = make(seed, eos_bias)
            src, mask = sources(seed)
            limits = max_output_lengths(mask, 1.2, 4)
            greedy = greedy_search(model, src, mask, limits, BOS, EOS)
            assert all(isinstance(h, Hypothesis) for h in greedy)
            greedy = [h.tokens for h in greedy]
            for lp in (0.0, 1.0):
                assert [hyps[0][0] for hyps in beam(model, src, mask, 1, lp=lp)] == greedy
            lengths += [(len(g), n) for g, n in zip(greedy, limits.tolist())]
    assert any(0 < g < n for g, n in lengths) and any(g == n for g, n in lengths)


@pytest.mark.parametrize("seed", range(5))
def test_beam_scores_are_model_logprobs_and_beat_greedy(seed):
    model = make(seed, eos_bias=0.5)
    src, mask = sources(seed)
    limits = max_output_lengths(mask, 1.2, 4).tolist()
    greedy = greedy_tokens(model, src, mask, max_output_lengths(mask, 1.2, 4))
    best = beam(model, src, mask, 4, lp=0.0)
    for i in range(src.shape[0]):
        n = int(mask[i].sum())
        one_src, one_mask = src[i : i + 1, :n], mask[i : i + 1, :n]
        ids, score = best[i][0]
        rescored = sequence_logprob(model, one_src, one_mask, ids, len(ids) < limits[i])
        assert score == pytest.approx(rescored, abs=1e-4)
        g = greedy[i]
        assert score >= sequence_logprob(model, one_src, one_mask, g, len(g) < limits[i]) - 1e-5


@pytest.mark.parametrize("seed", range(3))
def test_batched_equals_one_sentence_at_a_time(seed):
    model = make(seed, eos_bias=1.0)
    src, mask = sources(seed, lengths=(7, 2, 5, 9, 3))
    batched = beam(model, src, mask, 3, nbest=3)
    for i in range(src.shape[0]):
        n = int(mask[i].sum())
        alone = beam(model, src[i : i + 1, :n], mask[i : i + 1, :n], 3, nbest=3)[0]
        assert [ids for ids, _ in batched[i]] == [ids for ids, _ in alone]
        assert [s for _, s in batched[i]] == pytest.approx([s for _, s in alone], abs=1e-5)


def test_nbest_sorted_and_distinct():
    model = make(3, eos_bias=1.0)
    src, mask = sources(3)
    out = beam(model, src, mask, 5, nbest=4)
    for hyps in out:
        assert len(hyps) == 4
        scores = [s for _, s in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(ids) for ids, _ in hyps}) == 4
        assert all(EOS not in ids and BOS not in ids for ids, _ in hyps)
    with pytest.raises(ValueError):
        beam(model, src, mask, 2, nbest=3)


def test_max_length_respected_without_eos():
    model = make(0, eos_bias=-100.0)  # EOS never wins: every hypothesis runs to the limit
    src, mask = sources(0)
    limits = max_output_lengths(mask, 0.5, 2).tolist()
    for hyps in beam(model, src, mask, 3, a=0.5, b=2, nbest=3):
        assert len(hyps) == 3
    out = beam(model, src, mask, 3, a=0.5, b=2)
    assert [len(h[0][0]) for h in out] == limits
    assert [len(g) for g in greedy_tokens(model, src, mask, limits)] == limits
    assert [len(g) for g in greedy_tokens(model, src, mask, 2)] == [2] * 4


def test_max_output_lengths_excludes_source_eos():
    mask = torch.tensor([[True] * 11, [True] * 3 + [False] * 8])
    assert max_output_lengths(mask, 1.2, 10).tolist() == [22, 12]  # floor(1.2 * 10 + 10), floor(1.2 * 2 + 10)


def test_a_large_max_len_is_capped_at_the_decoders_positions():
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=1, decoder_layers=1, heads=4, dropout=0.0)
    model = EosBiased(replace(cfg, positions="learned", max_positions=12), V, V, PAD).eval()
    model.eos_bias = -100.0  # EOS never wins: every hypothesis runs to its limit
    src, mask = sources(0)
    limits = max_output_lengths(mask, 1000.0, 5000, model.max_positions)
    assert limits.tolist() == [12] * 4  # not a * src + b: step t reads position t, and there are 12
    assert [len(g) for g in greedy_tokens(model, src, mask, limits)] == [12] * 4
    out = beam_search(model, src, mask, limits, 3, 1.0, BOS, EOS)
    assert [len(hyps[0].tokens) for hyps in out] == [12] * 4
    assert max_output_lengths(mask, 1e300, 0).tolist() == [MAX_STEPS] * 4  # no positions: no int64 overflow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [17, 3000])
def test_top_log_probs_equal_full_log_softmax_topk(dtype, V):
    """Blocks of rows (several, the last one partial, for V = 3000) give the full computation's values bit for bit."""
    logits = (torch.randn(700, V, generator=torch.Generator().manual_seed(V)) * 4).to(dtype)
    full = torch.log_softmax(logits.float(), dim=-1)
    for k in (1, 10):
        values, ids = top_log_probs(logits, k)
        assert values.dtype == torch.float32 and values.shape == ids.shape == (700, k)
        assert torch.equal(values, full.topk(k, dim=-1).values)
        assert torch.equal(full.gather(1, ids), values)  # ids may order bf16 ties differently, never wrongly
        assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # k distinct tokens per row


@pytest.mark.parametrize("V", [3, 17, 500])
def test_best_continuations_equal_topk_over_all_beams(V):
    """Looking at each beam's best k only finds the sentence's best k over all K*V continuations."""
    g = torch.Generator().manual_seed(V)
    n, K = 6, 4
    scores = torch.randn(n, K, generator=g) * 3
    scores[0, 1:] = -math.inf  # the first step: one live beam
    logits = torch.randn(n * K, V, generator=g) * 3
    k = min(2 * K, K * V)
    cand = (scores[:, :, None] + torch.log_softmax(logits, dim=-1).view(n, K, V)).view(n, K * V)
    ref_scores, ref_idx = cand.topk(k, dim=1)
    top_scores, beam, tok = best_continuations(scores, logits, 2 * K)
    assert torch.equal(top_scores, ref_scores)
    finite = ref_scores > -math.inf  # among -inf candidates any order will do
    assert torch.equal((beam * V + tok)[finite], ref_idx[finite])


# ---------------------------------------------------------------------------- oracle

A, B_ = 3, 4


class Oracle(Seq2Seq):
    """p(next | prev) from a fixed table, independent of the source. Greedy is provably worse:

    after BOS: A 0.6, B 0.4;  after A: A 0.34, B 0.33, EOS 0.33;  after B: EOS 0.95, A 0.05.
    Greedy takes A then keeps taking A (0.34 > 0.33): P(A A A ...) < 0.6 * 0.34^k, and never
    ends; the best sequence is B EOS with P = 0.4 * 0.95 = 0.38 (vs A EOS: 0.198).
    """

    def __init__(self):
        super().__init__()
        self.pad_id = PAD
        table = torch.full((5, 5), 1e-9)
        table[BOS, A], table[BOS, B_] = 0.6, 0.4
        table[A, A], table[A, B_], table[A, EOS] = 0.34, 0.33, 0.33
        table[B_, EOS], table[B_, A] = 0.95, 0.05
        table[EOS, EOS] = table[PAD, EOS] = 1.0
        self.table = table.log()

    def encode(self, src, src_mask):
        return src.shape[0]

    def init_state(self, memory):
        return 0

    def decode_step(self, prev_tokens, state):
        return self.table[prev_tokens], state + 1

    def reorder_state(self, state, index):
        return state


def test_oracle_beam_finds_what_greedy_misses():
    model = Oracle()
    src = torch.tensor([[5, 5, 5, EOS]] * 2)
    mask = src != PAD
    assert greedy_tokens(model, src, mask, 6) == [[A] * 6] * 2
    for lp in (0.0, 1.0):
        out = beam(model, src, mask, 2, lp, 0.0, 6, nbest=2)
        for hyps in out:
            (ids, score), (ids2, score2) = hyps
            assert ids == [B_]
            assert score == pytest.approx(math.log(0.4 * 0.95) / 2**lp, rel=1e-5)
            assert score2 < score
    one = beam(model, src, mask, 1, 0.0, 0.0, 6)
    assert [h[0][0] for h in one] == [[A] * 6] * 2  # beam 1 is greedy, misses it too


class CountingOracle(Oracle):
    """The oracle, recording how many hypotheses each step computes."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def decode_step(self, prev_tokens, state):
        self.rows.append(prev_tokens.numel())
        return super().decode_step(prev_tokens, state)


def test_first_step_computes_one_beam_per_sentence():
    """All K beams start identical, so step 0 runs once per sentence; K per sentence after it."""
    model = CountingOracle()
    src = torch.tensor([[5, 5, 5, EOS]] * 3)
    out = beam(model, src, src != PAD, 2, 0.0, 0.0, 6)
    assert [hyps[0][0] for hyps in out] == [[B_]] * 3
    assert model.rows[:2] == [3, 6]


def test_beam_wider_than_the_vocabulary():
    """K = 6 beams over 5 words: step 0 has fewer candidates (5) than the 2K looked at; the search
    still finds the best sequence and n distinct hypotheses."""
    model = Oracle()
    src = torch.tensor([[5, 5, 5, EOS]] * 2)
    for hyps in beam(model, src, src != PAD, 6, 0.0, 0.0, 6, nbest=6):
        assert hyps[0][0] == [B_]
        assert hyps[0][1] == pytest.approx(math.log(0.4 * 0.95), rel=1e-5)
        assert len({tuple(ids) for ids, _ in hyps}) == 6
        assert [s for _, s in hyps] == sorted((s for _, s in hyps), reverse=True)


class FewPaths(Oracle):
    """Only two outputs are possible at all: after BOS, A (0.7) or EOS (0.3); after A, EOS. Every
    other word has log-probability -inf, as a model that rules words out gives them."""

    def __init__(self):
        super().__init__()
        table = torch.zeros(5, 5)
        table[BOS, A], table[BOS, EOS], table[A, EOS] = 0.7, 0.3, 1.0
        table[EOS, EOS] = table[PAD, EOS] = table[B_, EOS] = 1.0
        self.table = table.log()


@pytest.mark.parametrize("K", [3, 5])
def test_an_nbest_list_longer_than_the_possible_outputs_holds_only_those(K):
    """Beams beyond the possible outputs are dead ends (-inf) made of never-output words: their EOS
    continuations must not finish, so the n-best list is the two real outputs, not padded with them."""
    src = torch.tensor([[5, 5, EOS]] * 2)
    for hyps in beam_search(FewPaths(), src, src != PAD, torch.tensor([3, 3]), K, 1.0, BOS, EOS, nbest=K):
        assert [(h.tokens, h.log_prob) for h in hyps] == [
            ([A], pytest.approx(math.log(0.7))),
            ([], pytest.approx(math.log(0.3))),
        ]


def test_best_continuations_of_one_beam_over_a_small_vocabulary():
    """One live beam per sentence and V < 2K: the V real candidates first, then dead (-inf) ones
    that name a real parent beam."""
    g = torch.Generator().manual_seed(0)
    n, V, K = 3, 5, 4
    scores = torch.randn(n, 1, generator=g)
    logits = torch.randn(n, V, generator=g)
    top_scores, beam_, tok = best_continuations(scores, logits, 2 * K)
    ref_scores, ref_tok = (scores + torch.log_softmax(logits, dim=-1)).topk(V, dim=1)
    assert top_scores.shape == (n, 2 * K)
    assert torch.equal(top_scores[:, :V], ref_scores) and torch.equal(tok[:, :V], ref_tok)
    assert (top_scores[:, V:] == -math.inf).all()
    assert (beam_ == 0).all()


# ---------------------------------------------------------------------------- the stopping rule


class StepTable(Seq2Seq):
    """p(next | sentence, step, previous token) from a fixed random table over W words (PAD, BOS,
    EOS and three more): the same numbers in any batch, so a plain reference search can compare.
    It records the last step each sentence was decoded at."""

    W = 6

    def __init__(self, sentences: int, steps: int, eos_bias: float, seed: int = 0):
        super().__init__()
        self.pad_id = PAD
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(sentences, steps, self.W, self.W, generator=g) * 2
        logits[..., EOS] += eos_bias
        self.table = logits
        self.last_step = [-1] * sentences

    def encode(self, src, src_mask):
        return torch.arange(src.shape[0])

    def init_state(self, memory):
        return memory, 0

    def decode_step(self, prev_tokens, state):
        rows, t = state
        for i in rows.tolist():
            self.last_step[i] = t
        return self.table[rows, t, prev_tokens], (rows, t + 1)

    def reorder_state(self, state, index):
        return state[0][index], state[1]


def beam_to_the_limit(model: StepTable, i: int, max_len: int, K: int, lp: float, nbest: int):
    """Steps 1-3 of ``beam_search`` for sentence i, written plainly, without the early stop of step 4:
    it decodes to max_len. -> [(tokens, score)] of its n best, as ``beam``."""
    beams = [(torch.tensor(0.0), [])]  # (summed fp32 log-probability, ids)
    finished = []  # (score, ids), in the order found
    for t in range(max_len):
        cand = []
        for log_p, ids in beams:
            row = torch.log_softmax(model.table[i, t, ids[-1] if ids else BOS].float(), dim=-1)
            cand += [(log_p + row[y], ids + [y]) for y in range(model.W) if y not in (PAD, BOS)]  # never emitted
        top = sorted(cand, key=lambda c: -float(c[0]))[: 2 * K]
        finished += [(float(s) / (t + 1) ** lp, ids) for s, ids in top[:K] if ids[-1] == EOS]
        beams = [c for c in top if c[1][-1] != EOS][:K]
    finished += [(float(s) / max_len**lp, ids) for s, ids in beams]
    finished.sort(key=lambda h: -h[0])
    return [(ids[:-1] if ids[-1] == EOS else ids, score) for score, ids in finished[:nbest]]


def test_the_early_stop_loses_nothing_with_length_penalty_0_only():
    """Step 4 stops a sentence once its best live beam's score so far cannot beat the K-th finished.
    With length_penalty 0 that is exact: the n-best equal those of the same search decoding every
    sentence to its limit. With 1.0 a longer continuation can still win, and sometimes does."""
    n, K = 120, 3
    src = torch.tensor([[5, EOS]] * n)
    mask = src != PAD
    limits = torch.tensor([6 + i % 7 for i in range(n)])  # 6..12
    for lp in (0.0, 1.0):
        model = StepTable(n, 12, eos_bias=0.5)
        out = beam_search(model, src, mask, limits, K, lp, BOS, EOS, nbest=K)
        ours = [[(h.tokens, h.score(lp)) for h in hyps] for hyps in out]
        early = [i for i in range(n) if model.last_step[i] < limits[i] - 1]
        assert len(early) > n // 3  # the rule is exercised, not the limit
        reference = [beam_to_the_limit(model, i, int(limits[i]), K, lp, K) for i in range(n)]
        if lp == 0.0:
            for mine, full in zip(ours, reference):
                assert [ids for ids, _ in mine] == [ids for ids, _ in full]
                assert [s for _, s in mine] == pytest.approx([s for _, s in full], abs=1e-5)
        else:
            gains = [full[0][1] - mine[0][1] for mine, full in zip(ours, reference)]
            assert min(gains) > -1e-5  # decoding on only adds finished hypotheses
            assert any(g > 1e-3 for g in gains)  # and with length_penalty 1 some beat the early stop's best


class FavoursPadAndBos(Transformer):
    """A random Transformer whose PAD and BOS logits dwarf the others: an undertrained model can rank
    them first, and neither is text."""

    def project(self, h):
        logits = super().project(h)
        return logits + torch.nn.functional.one_hot(torch.tensor([PAD, BOS]), V).sum(0).to(logits.dtype) * 50.0


def test_search_never_emits_pad_or_bos_and_keeps_the_other_log_probs():
    torch.manual_seed(3)
    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=1, decoder_layers=1, heads=4, dropout=0.0)
    model = FavoursPadAndBos(cfg, V, V, PAD).eval()
    src, mask = sources(4)
    limits = torch.full((src.shape[0],), 6)
    found = [[h] for h in greedy_search(model, src, mask, limits, BOS, EOS)]
    found += beam_search(model, src, mask, limits, 4, 1.0, BOS, EOS, nbest=4)
    for hyps in found:
        for h in hyps:
            assert PAD not in h.tokens and BOS not in h.tokens and math.isfinite(h.log_prob), h
    # The log-probabilities are the model's own, not renormalised over the words allowed.
    for i, (h,) in enumerate(found[: src.shape[0]]):
        ended = h.steps == len(h.tokens) + 1
        assert h.log_prob == pytest.approx(
            sequence_logprob(model, src[i : i + 1], mask[i : i + 1], h.tokens, ended), abs=1e-4
        )


# ---------------------------------------------------------------------------- against a plain reference


class EosBiasedRNN(RNNSeq2Seq):
    """A random LSTM/GRU with a bias on the EOS logit, as ``EosBiased``."""

    eos_bias = 1.5

    def project(self, h):
        logits = super().project(h)
        return logits + torch.nn.functional.one_hot(torch.tensor(EOS), V).to(logits.dtype) * self.eos_bias


def small_models():
    """Random fp32 models of every decoder kind whose incremental state the search drives."""
    torch.manual_seed(0)
    tf = dict(d_model=16, ff_size=32, encoder_layers=2, decoder_layers=2, heads=2, dropout=0.0)
    post = EosBiased(TransformerConfig(**tf), V, V, PAD).eval()
    pre = EosBiased(TransformerConfig(**tf, norm="pre", tie_embeddings=False, tie_output=False), V, V, PAD).eval()
    for model in (post, pre):
        model.eos_bias = 1.5
    rnn = dict(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=2, dropout=0.0)
    lstm = EosBiasedRNN(RNNConfig(**rnn, attention="general"), V, V, PAD).eval()
    gru = EosBiasedRNN(RNNConfig(**rnn, rnn_cell="gru", input_feeding=False), V, V, PAD).eval()
    return {"transformer post": post, "transformer pre untied": pre, "lstm feeding": lstm, "gru": gru}


class PrefixScores:
    """log p(. | prefix, x) of one sentence from a teacher-forced pass over the whole prefix (no
    decoder state), remembered: the reference searches below ask for the same prefixes again."""

    def __init__(self, model, src, mask):
        self.model, self.src, self.mask, self.known = model, src, mask, {}

    def __call__(self, ids: list[int]) -> list[float]:
        if tuple(ids) not in self.known:
            with torch.no_grad():
                logits = self.model(self.src, self.mask, torch.tensor([[BOS] + ids]))[0, -1]
            self.known[tuple(ids)] = torch.log_softmax(logits.float(), dim=-1).tolist()
        return self.known[tuple(ids)]


def plain_beam(next_log_probs: PrefixScores, max_len: int, K: int, lp: float) -> list[tuple[list[int], float]]:
    """Beam search over one sentence as ``beam_search`` documents it, written plainly: every beam
    expanded by every word, the 2K best continuations, those among the best K that end in EOS
    finished, the best K others kept; the sentence stops at max_len or once it has K finished and
    its best live beam's log p / length so far ** lp is at most the K-th finished score.
    -> [(tokens, score)] of its K best, best first."""
    beams, finished = [(0.0, [])], []  # (summed log-probability, ids)
    for t in range(max_len):
        cand = []
        for log_p, ids in beams:
            row = next_log_probs(ids)
            cand += [(log_p + row[y], ids + [y]) for y in range(V) if y not in (PAD, BOS)]
        top = sorted(cand, key=lambda c: -c[0])[: 2 * K]
        finished += [(s / (t + 1) ** lp, ids[:-1]) for s, ids in top[:K] if ids[-1] == EOS]
        beams = [c for c in top if c[1][-1] != EOS][:K]
        if t + 1 == max_len:
            finished += [(s / max_len**lp, ids) for s, ids in beams]
        elif len(finished) >= K and beams[0][0] / (t + 1) ** lp <= sorted(s for s, _ in finished)[-K]:
            break
    finished.sort(key=lambda h: -h[0])
    return [(ids, score) for score, ids in finished[:K]]


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from threads, and lose much on a busy machine (threads spin-wait)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("name", ["transformer post", "transformer pre untied", "lstm feeding", "gru"])
def test_batched_beam_search_equals_a_plain_reference(name, one_thread):
    """Beam sizes 1-5, length penalties 0-2 and two length limits, four sentences of different
    lengths in one padded batch: the same n-best lists, tokens and scores, as the plain search of
    each sentence alone (which also checks the decoder's cached steps against full passes)."""
    model = small_models()[name]
    src, mask = sources(5, lengths=(5, 2, 7, 3))
    alone = [PrefixScores(model, src[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(mask.sum(1).tolist())]
    ended = cut = 0
    for K, lp, (a, b) in itertools.product(range(1, 6), (0.0, 0.6, 1.0, 2.0), ((0.5, 1), (1.0, 4))):
        limits = max_output_lengths(mask, a, b)
        out = beam_search(model, src, mask, limits, K, lp, BOS, EOS, nbest=K)
        for i, hyps in enumerate(out):
            reference = plain_beam(alone[i], int(limits[i]), K, lp)
            assert [h.tokens for h in hyps] == [ids for ids, _ in reference], (K, lp, a, b, i)
            assert [h.score(lp) for h in hyps] == pytest.approx([s for _, s in reference], abs=1e-4)
            ended += sum(h.steps == len(h.tokens) + 1 for h in hyps)
            cut += sum(h.steps == len(h.tokens) for h in hyps)
    assert ended and cut  # both ends of a hypothesis occur


class MemoryCopyingRNN(EosBiasedRNN):
    """The RNN reordering as it did before: the encoder memory copied row by row at every reorder."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reordered_rows = []  # N' of every reorder

    def reorder_state(self, state, index):
        self.reordered_rows.append(index.numel())
        return replace(super().reorder_state(state, index), memory=state.memory.index_select(index))


@pytest.mark.parametrize(
    "rnn, seed, eos_bias",  # random models whose sentences end by EOS and by their limit, at varied steps
    [(dict(attention="general"), 1, 0.15), (dict(rnn_cell="gru", input_feeding=False), 0, 0.2)],
    ids=["lstm feeding", "gru"],
)
def test_rnn_beam_search_is_the_same_as_with_the_memory_copied_at_every_reorder(rnn, seed, eos_bias, one_thread):
    """The RNN keeps its memory while beams reorder within their sentences: the n-best lists, their
    tokens, log-probabilities, steps and attention maps, are those of copying it at every reorder,
    to the bit, with sentences leaving the batch at different steps."""
    cfg = RNNConfig(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=2, dropout=0.0, **rnn)
    torch.manual_seed(seed)
    model = EosBiasedRNN(cfg, V, V, PAD).eval()
    copying = MemoryCopyingRNN(cfg, V, V, PAD).eval()
    copying.load_state_dict(model.state_dict())
    model.eos_bias = copying.eos_bias = eos_bias
    src, mask = sources(3, lengths=(6, 2, 9, 4, 3))
    ended = cut = 0
    for K, lp in ((1, 0.0), (3, 1.0), (5, 0.6)):
        args = (src, mask, max_output_lengths(mask, 1.0, 3), K, lp, BOS, EOS)
        copying.reordered_rows = []
        got = beam_search(model, *args, nbest=K, attention=True)
        want = beam_search(copying, *args, nbest=K, attention=True)
        assert len(set(copying.reordered_rows)) >= 3, copying.reordered_rows  # sentences left at two steps or more
        for hyps, expected in zip(got, want):
            assert [(h.tokens, h.log_prob, h.steps) for h in hyps] == [
                (h.tokens, h.log_prob, h.steps) for h in expected
            ]
            assert all(torch.equal(h.attention, e.attention) for h, e in zip(hyps, expected))
            ended += sum(1 < h.steps == len(h.tokens) + 1 for h in hyps)
            cut += sum(h.steps == len(h.tokens) for h in hyps)
    assert ended and cut
