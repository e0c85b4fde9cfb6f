"""TeacherCollapseCheck: a uniform or non-finite teacher is flagged; healthy teachers are not."""

from __future__ import annotations

import math

import pytest
import torch

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.findings import Code, Severity
from distill_guard.observations import RunSpec, StepMetrics, TeacherScores
from tests.checks._syncs import host_reads
from tests.conftest import LN_QWEN3_V, QWEN3_V

UNIFORM = -LN_QWEN3_V
KNOWN = RunSpec(vocab_size=QWEN3_V)
UNKNOWN = RunSpec()


def healthy_topk(n: int = 64, k: int = 16, seed: int = 0, vocab: int = 2000) -> torch.Tensor:
    """Top-k logprobs of a peaked, healthy teacher (sorted, all finite)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 4
    return torch.log_softmax(logits, -1).topk(k, -1).values


def healthy_tokens(n: int = 512, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(n, generator=g).pow(3) * 6  # mostly near 0, a tail to −6


def scores(topk=None, tokens=None, mask=None, step=3) -> TeacherScores:
    return TeacherScores(step, token_logprobs=tokens, topk_logprobs=topk, mask=mask)


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def test_uniform_topk_rows_are_critical_at_qwen3_vocab():
    x = torch.full((64, 16), UNIFORM)
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(topk=x), KNOWN)
    assert f.code == Code.TEACHER_UNIFORM and f.severity is Severity.CRITICAL
    assert f.step == 3
    assert f.values["uniform_fraction"] == 1.0
    assert f.values["uniform_logprob"] == pytest.approx(UNIFORM)
    assert "151936" in f.message and "11.93" in f.message


@pytest.mark.parametrize("fraction", [1.0, 0.25, 0.10])
def test_uniform_sampled_token_fraction(fraction):
    x = healthy_tokens(1000)
    n = int(fraction * 1000)
    x[:n] = UNIFORM
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(tokens=x), KNOWN)
    assert f.code == Code.TEACHER_UNIFORM
    assert f.values["uniform_fraction"] == pytest.approx(fraction)


def test_one_token_at_minus_ln_v_by_chance_is_not_collapse():
    x = healthy_tokens(1000)
    x[17] = UNIFORM  # 0.1 % of tokens, below min_token_fraction
    assert TeacherCollapseCheck().on_teacher_scores(scores(tokens=x), KNOWN) == []


@pytest.mark.parametrize("fraction", [0.25, 0.02])
def test_partial_collapse_of_some_rows_is_flagged(fraction):
    """One dead replica among many: a quarter (or 2 %) of the rows uniform still counts."""
    x = healthy_topk(200)
    n = int(fraction * 200)
    x[:n] = UNIFORM
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(topk=x), KNOWN)
    assert f.code == Code.TEACHER_UNIFORM
    assert f.values["uniform_fraction"] == pytest.approx(fraction)


@pytest.mark.parametrize("run", [KNOWN, UNKNOWN], ids=["vocab", "no-vocab"])
def test_confident_teacher_with_all_logprobs_zero_is_not_flagged(run):
    check = TeacherCollapseCheck()
    assert check.on_teacher_scores(scores(tokens=torch.zeros(300)), run) == []
    assert check.on_teacher_scores(scores(topk=torch.zeros(300, 1)), run) == []
    certain = torch.full((300, 16), -math.inf)
    certain[:, 0] = 0.0  # all mass on one token: the rest of top-k is −inf
    assert check.on_teacher_scores(scores(topk=certain), run) == []


@pytest.mark.parametrize("run", [KNOWN, UNKNOWN], ids=["vocab", "no-vocab"])
@pytest.mark.parametrize("value", [-0.25, -2.0, -9.0])
def test_healthy_teacher_repeating_a_value_is_not_flagged(run, value):
    """Zero spread is not collapse: the repeated value must be −ln V."""
    check = TeacherCollapseCheck()
    assert check.on_teacher_scores(scores(tokens=torch.full((400,), value)), run) == []


@pytest.mark.parametrize("run", [KNOWN, UNKNOWN], ids=["vocab", "no-vocab"])
@pytest.mark.parametrize("seed", range(3))
def test_healthy_teacher_is_not_flagged(run, seed):
    check = TeacherCollapseCheck()
    out = check.on_teacher_scores(
        scores(topk=healthy_topk(seed=seed), tokens=healthy_tokens(seed=seed)), run
    )
    assert out == []


@pytest.mark.parametrize("kind", ["topk", "tokens"])
@pytest.mark.parametrize("bad", [float("nan"), math.inf])
def test_nan_or_plus_inf_is_nonfinite(kind, bad):
    x = healthy_topk() if kind == "topk" else healthy_tokens()
    x.view(-1)[[3, 10, 11]] = bad
    sc = scores(topk=x) if kind == "topk" else scores(tokens=x)
    found = TeacherCollapseCheck().on_teacher_scores(sc, KNOWN)
    (f,) = [f for f in found if f.code == Code.TEACHER_NONFINITE]
    assert f.severity is Severity.CRITICAL
    assert f.values["nonfinite"] == 3
    assert f.values["count"] == x.numel()
    assert "3 of" in f.message
    assert Code.TEACHER_UNIFORM not in codes(found)


def test_minus_inf_is_allowed_in_topk_but_not_per_token():
    topk = healthy_topk()
    topk[:, -4:] = -math.inf  # fewer than k tokens with mass
    assert TeacherCollapseCheck().on_teacher_scores(scores(topk=topk), KNOWN) == []
    tokens = healthy_tokens()
    tokens[5] = -math.inf  # a sampled token cannot have probability 0
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(tokens=tokens), KNOWN)
    assert f.code == Code.TEACHER_NONFINITE and f.values["nonfinite"] == 1


def test_mask_hides_padding():
    x = healthy_topk(20)
    x[15:] = float("nan")  # padding positions
    mask = torch.ones(20, dtype=torch.bool)
    mask[15:] = False
    assert TeacherCollapseCheck().on_teacher_scores(scores(topk=x, mask=mask), KNOWN) == []
    t = healthy_tokens(20)
    t[15:] = UNIFORM
    assert TeacherCollapseCheck().on_teacher_scores(scores(tokens=t, mask=mask), KNOWN) == []
    assert codes(TeacherCollapseCheck().on_teacher_scores(scores(tokens=t), KNOWN)) == [
        Code.TEACHER_UNIFORM
    ]


@pytest.mark.parametrize("vocab", [QWEN3_V, 32000, 154880])
def test_unknown_vocab_flat_rows_are_flagged_with_inferred_vocab(vocab):
    x = torch.full((32, 16), -math.log(vocab))
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(topk=x), UNKNOWN)
    assert f.code == Code.TEACHER_UNIFORM and f.severity is Severity.CRITICAL
    assert f.values["inferred_vocab_size"] == vocab
    assert str(vocab) in f.message


@pytest.mark.parametrize("fraction", [0.25, 0.05])
def test_unknown_vocab_partial_collapse_is_flagged_with_the_right_vocab(fraction):
    """The inferred V comes from the flat rows, not from a mean diluted by healthy rows."""
    x = healthy_topk(200)
    x[: int(fraction * 200)] = UNIFORM
    (f,) = TeacherCollapseCheck().on_teacher_scores(scores(topk=x), UNKNOWN)
    assert f.code == Code.TEACHER_UNIFORM
    assert f.values["inferred_vocab_size"] == pytest.approx(QWEN3_V, rel=1e-3)


def test_unknown_vocab_single_column_topk_is_not_judged():
    """With k = 1 every row is trivially flat: nothing can be inferred from it."""
    x = torch.full((50, 1), UNIFORM)
    assert TeacherCollapseCheck().on_teacher_scores(scores(topk=x), UNKNOWN) == []


def test_unknown_vocab_per_token_input_cannot_be_judged():
    x = torch.full((100,), UNIFORM)
    assert TeacherCollapseCheck().on_teacher_scores(scores(tokens=x), UNKNOWN) == []


def test_topk_and_token_views_of_one_batch_give_one_finding():
    out = TeacherCollapseCheck().on_teacher_scores(
        scores(topk=torch.full((10, 4), UNIFORM), tokens=torch.full((10,), UNIFORM)), KNOWN
    )
    assert codes(out) == [Code.TEACHER_UNIFORM]


@pytest.mark.parametrize(
    "value,flagged",
    [(UNIFORM, True), (UNIFORM + 5e-4, True), (UNIFORM + 0.01, False), (-0.35, False)],
)
def test_scalar_teacher_logprob_metric(value, flagged):
    out = TeacherCollapseCheck().on_step_metrics(StepMetrics(7, {"teacher_logprob": value}), KNOWN)
    assert codes(out) == ([Code.TEACHER_UNIFORM] if flagged else [])
    if flagged:
        assert out[0].step == 7 and out[0].severity is Severity.CRITICAL


def test_scalar_metric_needs_vocab_and_a_finite_value():
    check = TeacherCollapseCheck()
    assert check.on_step_metrics(StepMetrics(1, {"teacher_logprob": UNIFORM}), UNKNOWN) == []
    assert check.on_step_metrics(StepMetrics(1, {"teacher_logprob": math.nan}), KNOWN) == []


def test_tolerance_is_configurable():
    x = torch.full((10, 4), UNIFORM + 0.004)
    # outside the exact test's tolerance, but a teacher this spread is still caught
    assert codes(TeacherCollapseCheck().on_teacher_scores(scores(topk=x), KNOWN)) == [
        Code.TEACHER_NEAR_UNIFORM
    ]
    assert codes(TeacherCollapseCheck(atol=0.01).on_teacher_scores(scores(topk=x), KNOWN)) == [
        Code.TEACHER_UNIFORM
    ]


def test_a_mean_pinned_at_minus_ln_v_betrays_v_when_it_is_not_configured():
    """Replay without --vocab-size of a column pinned at −ln 151936 raised nothing before."""
    check = TeacherCollapseCheck()
    pinned = [StepMetrics(s, {"teacher_logprob": -LN_QWEN3_V}) for s in range(80)]
    out = [check.on_step_metrics(m, RunSpec()) for m in pinned]
    assert not any(out[:2])  # one or two steps are not yet a pinned level
    f = out[2][0]
    assert f.code == Code.TEACHER_UNIFORM and f.severity is Severity.CRITICAL
    assert f.values["inferred_vocab_size"] == QWEN3_V and "−ln 151936" in f.message
    assert all(out[2:])


def test_a_healthy_or_steady_high_mean_is_never_read_as_pinned():
    check = TeacherCollapseCheck()
    steady = [StepMetrics(s, {"teacher_logprob": -0.35}) for s in range(50)]  # V = 1: no
    noisy = [StepMetrics(s, {"teacher_logprob": -6.0 - 0.01 * (s % 3)}) for s in range(50)]
    assert not any(check.on_step_metrics(m, RunSpec()) for m in steady + noisy)


def spread_rows(n, top1, k=8, gap=0.05, seed=0):
    """Top-k rows of a real distribution (mass at most 1): top-1 about ``top1``, the rest
    ``gap`` apart, lowered as a block where they would carry more than what the top-1 leaves."""
    g = torch.Generator().manual_seed(seed)
    start = top1 + 0.03 * abs(top1) * torch.randn(n, 1, generator=g)
    rows = start - gap * torch.arange(k).float() * (1 + torch.rand(n, k, generator=g))
    head, tail = rows[:, :1], rows[:, 1:]
    room = torch.log1p(-head.exp()) + math.log(0.99)  # what the top-1 leaves, with a margin
    excess = (torch.logsumexp(tail, dim=1, keepdim=True) - room).clamp(min=0)
    return torch.cat([head, tail - excess], dim=1)


def test_a_spread_but_not_uniform_teacher_is_near_uniform():
    """Garbage weights: top-1 around −0.66 ln V (−7.86 at V = 151936 in the report), rows not
    flat, so the exact uniform test stays silent; the median top-1 is what gives it away."""
    rows = spread_rows(64, -0.66 * LN_QWEN3_V)
    (f,) = TeacherCollapseCheck().on_teacher_scores(TeacherScores(5, topk_logprobs=rows), KNOWN)
    assert f.code == Code.TEACHER_NEAR_UNIFORM and f.severity is Severity.CRITICAL
    assert f.values["top1_median"] <= f.values["bound"] == pytest.approx(-0.5 * LN_QWEN3_V)


def test_a_healthy_teacher_with_many_uncertain_positions_is_not_near_uniform():
    confident = spread_rows(60, -0.3)
    uncertain = spread_rows(40, -5.0, seed=1)  # 40 % of positions far from sure
    rows = torch.cat([confident, uncertain])
    assert (
        TeacherCollapseCheck().on_teacher_scores(TeacherScores(0, topk_logprobs=rows), KNOWN) == []
    )


def test_one_replica_of_four_serving_garbage_is_a_partial_collapse():
    """A quarter of the samples from a near-uniform replica: the batch median looks healthy,
    the per-sample medians are bimodal."""
    healthy = [spread_rows(32, -0.3, seed=s) for s in range(12)]
    garbage = [spread_rows(32, -0.66 * LN_QWEN3_V, seed=20 + s) for s in range(4)]
    rows = torch.cat(healthy + garbage)
    sample = torch.arange(16).repeat_interleave(32)
    check = TeacherCollapseCheck()
    assert check.on_teacher_scores(TeacherScores(0, topk_logprobs=rows), KNOWN) == []
    (f,) = check.on_teacher_scores(TeacherScores(0, topk_logprobs=rows, sample_index=sample), KNOWN)
    assert f.code == Code.TEACHER_NEAR_UNIFORM and f.values["sample_fraction"] == 0.25
    healthy_only = torch.cat(healthy)
    sample = torch.arange(12).repeat_interleave(32)
    assert (
        check.on_teacher_scores(
            TeacherScores(0, topk_logprobs=healthy_only, sample_index=sample), KNOWN
        )
        == []
    )


def test_a_healthy_sample_with_mostly_uncertain_positions_is_not_a_partial_collapse():
    """At V = 1024 the near-uniform bound (−3.47) lies inside a healthy teacher's uncertain
    positions; a sample dominated by them still has a confident quarter (the benchmark's first
    run of this check raised 222 false alarms on such samples with a per-sample median)."""
    run = RunSpec(vocab_size=1024)
    confident = [spread_rows(32, -0.2, seed=s) for s in range(7)]
    mostly_uncertain = torch.cat([spread_rows(20, -4.0, seed=40), spread_rows(12, -0.3, seed=41)])
    rows = torch.cat([*confident, mostly_uncertain])
    sample = torch.arange(8).repeat_interleave(32)
    scores = TeacherScores(0, topk_logprobs=rows, sample_index=sample)
    assert TeacherCollapseCheck().on_teacher_scores(scores, run) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda v: (
            torch.full((16,), -1.0),
            torch.full((16, 4), -2.0) + torch.tensor([2.7, 0, 0, 0]),
        ),
        lambda v: (torch.full((16,), 0.7), None),
        lambda v: (torch.full((16,), -1.0), torch.log(torch.full((16, 4), 0.4))),
    ],
    ids=["top-k logprob +0.7", "token logprob +0.7", "top-k row mass 1.6"],
)
def test_values_no_distribution_has_are_critical_never_healthy(make) -> None:
    """A positive logprob, or a top-k row summing past 1, is not a distribution (logits, a
    sign error): critical, whatever V is, configured or not."""
    from distill_guard.checks.teacher_collapse import TeacherCollapseCheck
    from distill_guard.findings import Code, Severity
    from distill_guard.observations import RunSpec, TeacherScores

    tok, top = make(None)
    for vocab in (None, 151936):
        found = TeacherCollapseCheck().on_teacher_scores(
            TeacherScores(3, tok, top), RunSpec(vocab_size=vocab)
        )
        assert [f.code for f in found] == [Code.TEACHER_IMPOSSIBLE], found
        assert (
            found[0].severity is Severity.CRITICAL and "not log-probabilities" in found[0].message
        )


def test_a_healthy_peaked_teacher_is_not_impossible() -> None:
    """fp32 logprobs of a peaked distribution sit at about 0 and its top-k sums to about 1."""
    from distill_guard.checks.teacher_collapse import TeacherCollapseCheck
    from distill_guard.observations import RunSpec, TeacherScores

    logits = torch.randn(64, 1000) * 30
    lp = torch.log_softmax(logits, dim=-1)
    top = lp.topk(16, dim=-1).values
    found = TeacherCollapseCheck().on_teacher_scores(
        TeacherScores(0, top[:, 0].clone(), top), RunSpec(vocab_size=1000)
    )
    assert found == []


@pytest.mark.parametrize("run", [KNOWN, UNKNOWN], ids=["vocab", "no-vocab"])
@pytest.mark.parametrize("samples", [False, True], ids=["batch", "per-sample"])
def test_a_healthy_step_reads_the_host_once_for_both_views(run, samples):
    """Top-k rows and sampled tokens: every statistic of both views reaches the host in one
    transfer (on a GPU each ``tolist``/``item``/``float``/``int`` is a full round trip, on the
    guard's per-step path); the detail behind a finding is computed only for one."""
    topk = healthy_topk(512)
    tokens = topk[:, 0] - torch.rand(512, generator=torch.Generator().manual_seed(1))
    sample = torch.arange(16).repeat_interleave(32) if samples else None
    teacher = TeacherScores(3, token_logprobs=tokens, topk_logprobs=topk, sample_index=sample)
    with host_reads() as reads:
        found = TeacherCollapseCheck().on_teacher_scores(teacher, run)
    assert found == []
    assert len(reads) <= 1, reads


def _metric_findings(check: TeacherCollapseCheck, run: RunSpec, means: list[float]) -> list:
    out = []
    for step, mean in enumerate(means):
        out += check.on_step_metrics(StepMetrics(step, {"teacher_logprob": mean}), run)
    return out


def test_a_uniform_teacher_with_a_wrong_vocab_size_is_still_caught_and_the_size_named():
    """Issue 28: run.vocab_size 1000 for a teacher of 151936 tokens blinded the exact test: a
    mean pinned at −ln 151936 and below −ln 1000 (impossible if V were right) said nothing."""
    wrong = RunSpec(vocab_size=1000)
    found = _metric_findings(TeacherCollapseCheck(), wrong, [-0.35] + [UNIFORM] * 5)
    vocab = [f for f in found if f.code == Code.CONFIG_VOCAB_SIZE]
    assert len(vocab) == 1 and vocab[0].step == 1 and vocab[0].severity is Severity.WARN
    assert "-11.93121 is below −ln V = -6.90776" in vocab[0].message
    assert "V = 1000" in vocab[0].message
    uniform = [f for f in found if f.code == Code.TEACHER_UNIFORM]
    assert uniform and uniform[0].step == 3 and uniform[0].severity is Severity.CRITICAL
    assert uniform[0].values["inferred_vocab_size"] == QWEN3_V
    assert "configured vocab_size V = 1000" in uniform[0].message


def test_too_large_a_vocab_size_still_catches_a_pinned_uniform_teacher():
    found = _metric_findings(TeacherCollapseCheck(), RunSpec(vocab_size=10**6), [UNIFORM] * 4)
    assert codes(found) == [Code.TEACHER_UNIFORM, Code.TEACHER_UNIFORM]


@pytest.mark.parametrize("vocab", [1000, QWEN3_V])
def test_a_healthy_teacher_column_says_nothing_of_the_vocab_size(vocab):
    means = [-0.35 + 0.02 * math.sin(i) for i in range(200)]
    assert _metric_findings(TeacherCollapseCheck(), RunSpec(vocab_size=vocab), means) == []


def test_the_vocab_size_warning_is_said_once_even_across_a_resume():
    check = TeacherCollapseCheck()
    wrong = RunSpec(vocab_size=1000)
    assert codes(_metric_findings(check, wrong, [-8.0])) == [Code.CONFIG_VOCAB_SIZE]
    resumed = TeacherCollapseCheck()
    resumed.load_state_dict(check.state_dict())
    assert _metric_findings(resumed, wrong, [-8.0 - 0.1 * i for i in range(5)]) == []
