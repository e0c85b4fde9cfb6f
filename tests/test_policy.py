"""Policy: findings → one decision per stage, with patience, escalation and monitor-only mode."""

from __future__ import annotations

import json

import pytest

from distill_guard.findings import Code, Finding, Severity
from distill_guard.policy import TEACHER_ATTRIBUTED, Action, Decision, Policy


def finding(code=Code.TEACHER_UNIFORM, severity=Severity.CRITICAL, step=0) -> Finding:
    return Finding(code, severity, f"{code} at step {step}", step)


def crit(step=0, code=Code.TEACHER_UNIFORM):
    return [finding(code, Severity.CRITICAL, step)]


def warn(step=0, code=Code.STUDENT_TRUNCATION):
    return [finding(code, Severity.WARN, step)]


def test_nothing_or_info_continues():
    p = Policy()
    d = p.decide(0, [])
    assert d.action is Action.CONTINUE and d.reasons == () and not d.acts
    d = p.decide(1, [finding(Code.STUDENT_ENTROPY_DROP, Severity.INFO, 1)])
    assert d.action is Action.CONTINUE


def test_a_warning_alerts_and_carries_its_reason():
    d = Policy().decide(0, warn())
    assert d.action is Action.ALERT and not d.acts
    assert [f.code for f in d.reasons] == [Code.STUDENT_TRUNCATION]
    assert Code.STUDENT_TRUNCATION in d.message


@pytest.mark.parametrize("code", sorted(TEACHER_ATTRIBUTED))
@pytest.mark.parametrize("action", [Action.REWAKE, Action.SKIP_BATCH, Action.HALT])
def test_teacher_attributed_critical_takes_the_critical_action(code, action):
    d = Policy(critical_action=action).decide(0, crit(code=code))
    assert d.action is action and d.acts


@pytest.mark.parametrize("code", [Code.METRIC_NONFINITE, Code.STUDENT_ENTROPY_LIMIT])
def test_other_critical_findings_skip_the_batch(code):
    assert Policy().decide(0, crit(code=code)).action is Action.SKIP_BATCH


def test_info_and_warn_do_not_mask_a_critical():
    findings = [finding(Code.STUDENT_ENTROPY_DROP, Severity.INFO), *warn(), *crit()]
    d = Policy().decide(0, findings)
    assert d.action is Action.REWAKE
    assert {f.code for f in d.reasons} == {Code.STUDENT_TRUNCATION, Code.TEACHER_UNIFORM}


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_halt_after_n_consecutive_critical_steps(n):
    p = Policy(halt_after_critical_steps=n)
    actions = [p.decide(s, crit(s)).action for s in range(n + 2)]
    assert actions.index(Action.HALT) == n - 1
    assert all(a is Action.HALT for a in actions[n - 1 :])
    assert all(a is Action.REWAKE for a in actions[: n - 1])


def test_a_clean_step_breaks_the_run():
    p = Policy(halt_after_critical_steps=3)
    seq = [crit(0), crit(1), [], crit(3), crit(4), crit(5)]
    actions = [p.decide(s, f).action for s, f in enumerate(seq)]
    assert actions == [
        Action.REWAKE,
        Action.REWAKE,
        Action.CONTINUE,
        Action.REWAKE,
        Action.REWAKE,
        Action.HALT,
    ]


def test_several_stages_of_one_step_count_once():
    p = Policy(halt_after_critical_steps=3)
    for step in range(2):
        assert p.decide(step, crit(step)).action is Action.REWAKE  # teacher-scores stage
        assert p.decide(step, crit(step, Code.LOSS_JSD_CEILING)).action is Action.REWAKE  # metrics
        assert p.decide(step, []).action is Action.CONTINUE  # another stage with nothing
    assert p.decide(2, crit(2)).action is Action.HALT


def test_a_later_stage_that_finds_something_counts_its_step():
    p = Policy(halt_after_critical_steps=2)
    p.decide(0, [])  # teacher stage clean
    assert p.decide(0, crit(0)).action is Action.REWAKE  # metrics stage finds it: step 0 counts
    assert p.decide(1, crit(1)).action is Action.HALT


def test_resolved_resets_the_critical_run():
    p = Policy(halt_after_critical_steps=3)
    p.decide(0, crit(0))
    p.decide(1, crit(1))
    p.resolved(1)  # a verified repair
    assert p.decide(2, crit(2)).action is Action.REWAKE
    assert p.decide(3, crit(3)).action is Action.REWAKE
    assert p.decide(4, crit(4)).action is Action.HALT


def test_steps_of_none_count_as_separate_observations():
    p = Policy(halt_after_critical_steps=2)
    assert p.decide(None, crit()).action is Action.REWAKE
    assert p.decide(None, crit()).action is Action.HALT


@pytest.mark.parametrize(
    "findings,intended",
    [
        (crit(), Action.REWAKE),
        (crit(code=Code.METRIC_NONFINITE), Action.SKIP_BATCH),
    ],
)
def test_monitor_only_caps_at_alert_and_records_intent(findings, intended):
    d = Policy(monitor_only=True).decide(0, findings)
    assert d.action is Action.ALERT and d.intended is intended and not d.acts
    assert "monitor-only" in d.message and intended.value in d.message


def test_monitor_only_records_an_intended_halt_and_leaves_warnings_alone():
    p = Policy(monitor_only=True, halt_after_critical_steps=2)
    p.decide(0, crit(0))
    d = p.decide(1, crit(1))
    assert d.action is Action.ALERT and d.intended is Action.HALT
    d = p.decide(2, warn(2))
    assert d.action is Action.ALERT and d.intended is None
    assert p.decide(3, []).action is Action.CONTINUE


@pytest.mark.parametrize("patience", [1, 2, 4])
@pytest.mark.parametrize("escalation", [Action.HALT, Action.SKIP_BATCH])
def test_warn_patience_escalates(patience, escalation):
    p = Policy(warn_patience=patience, warn_escalation=escalation)
    actions = [p.decide(s, warn(s)).action for s in range(patience + 1)]
    assert actions[: patience - 1] == [Action.ALERT] * (patience - 1)
    assert actions[patience - 1 :] == [escalation] * 2
    assert escalation.value in p.decide(patience + 1, warn()).message


def test_without_warn_patience_warnings_only_alert_forever():
    p = Policy()
    assert {p.decide(s, warn(s)).action for s in range(100)} == {Action.ALERT}


def test_state_dict_round_trip_mid_incident():
    a = Policy(halt_after_critical_steps=3, warn_patience=3)
    a.decide(0, crit(0) + warn(0))
    a.decide(1, crit(1) + warn(1))
    state = json.loads(json.dumps(a.state_dict()))
    b = Policy(halt_after_critical_steps=3, warn_patience=3)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert b.decide(2, crit(2)).action is Action.HALT
    c = Policy(halt_after_critical_steps=3, warn_patience=3)
    c.load_state_dict(state)
    assert c.decide(2, warn(2)).action is Action.HALT  # the warn run survived too
    fresh = Policy(halt_after_critical_steps=3)
    assert fresh.decide(2, crit(2)).action is Action.REWAKE  # without the state it would not


def test_same_step_after_resume_still_counts_once():
    a = Policy(halt_after_critical_steps=2)
    a.decide(5, crit(5))
    b = Policy(halt_after_critical_steps=2)
    b.load_state_dict(a.state_dict())
    assert b.decide(5, crit(5)).action is Action.REWAKE  # same step, another stage


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"halt_after_critical_steps": 0}, "halt_after_critical_steps"),
        ({"halt_after_critical_steps": -2}, "halt_after_critical_steps"),
        ({"warn_patience": 0}, "warn_patience"),
        ({"critical_action": Action.ALERT}, "critical_action"),
        ({"critical_action": "continue"}, "critical_action"),
        ({"critical_action": "bogus"}, "critical_action"),
        ({"warn_escalation": "bogus"}, "warn_escalation"),
        ({"warn_escalation": "continue"}, "warn_escalation"),  # would silence warnings
    ],
)
def test_bad_config_raises_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Policy(**kwargs)


def test_actions_by_value_are_accepted():
    p = Policy(critical_action="halt", warn_escalation="skip_batch")
    assert p.critical_action is Action.HALT and p.warn_escalation is Action.SKIP_BATCH


def test_action_order_and_decision_dict():
    assert [a.rank for a in Action] == sorted(a.rank for a in Action)
    assert Action.CONTINUE.rank < Action.ALERT.rank < Action.SKIP_BATCH.rank
    assert Action.SKIP_BATCH.rank < Action.REWAKE.rank < Action.HALT.rank
    d = Policy(monitor_only=True).decide(4, crit(4) + crit(4, Code.LOSS_JSD_CEILING))
    out = d.to_dict()
    assert out == {
        "step": 4,
        "action": "alert",
        "intended": "rewake",
        "codes": sorted([Code.TEACHER_UNIFORM, Code.LOSS_JSD_CEILING]),
        "message": d.message,
        "repaired": False,
    }
    assert Decision(0, Action.SKIP_BATCH).acts and not Decision(0, Action.ALERT).acts


def test_critical_findings_at_a_later_stage_count_despite_a_clean_earlier_stage():
    """Each step: clean teacher scores, then a critical finding at the metrics stage. The clean
    stage reset the count, so 10 such steps never halted against "halt after 3"."""
    p = Policy()
    actions = []
    for step in range(10):
        p.decide(step, [])  # the teacher-scores stage of the step: nothing found
        actions.append(p.decide(step, crit(step, Code.STUDENT_ENTROPY_LIMIT)).action)
    assert actions[:3] == [Action.SKIP_BATCH, Action.SKIP_BATCH, Action.HALT]


def test_a_step_with_no_hit_at_any_stage_ends_the_run():
    p = Policy()
    p.decide(0, crit(0))
    p.decide(1, crit(1))
    p.decide(2, [])  # a clean step
    p.decide(2, [])
    assert p.decide(3, crit(3)).action is Action.REWAKE  # counting starts again


def test_one_order_of_decisions_actions_then_intentions():
    """Decision.priority is the order the ranks' agreement and StepGuard both use: the action
    first, then what a monitor-only policy would have done."""
    from distill_guard.policy import worst

    cont = Decision(0, Action.CONTINUE)
    watch = Decision(0, Action.ALERT)
    would_halt = Decision(0, Action.ALERT, intended=Action.HALT)
    skip = Decision(0, Action.SKIP_BATCH)
    halt = Decision(0, Action.HALT)
    order = [cont, watch, would_halt, skip, halt]
    assert [d.priority for d in order] == sorted(d.priority for d in order)
    assert len({d.priority for d in order}) == len(order)
    assert worst(skip, would_halt, cont) is skip and worst(watch, would_halt) is would_halt
    assert worst(watch, Decision(0, Action.ALERT)) is watch  # the first of equals
