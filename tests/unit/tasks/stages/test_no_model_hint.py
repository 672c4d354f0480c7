"""When a first run's champion is refused and nothing is in production, the error's fix names
the rfm family (the baseline's recipe, which the gate accepts) when it did not contend."""

from __future__ import annotations

from tasks.stages.train import no_model_fixes


def test_the_fix_names_the_rfm_family_when_it_did_not_contend():
    fix = no_model_fixes("m-1", ["logistic", "gbm"])
    assert fix.startswith("add the rfm family (the RFM baseline's recipe")
    assert "`--families rfm,logistic,gbm`" in fix and "HYBRIDFLOW_TRAIN__FAMILIES" in fix
    assert "`hybridflow models promote m-1`" in fix and "more history" in fix


def test_the_fix_does_not_name_rfm_when_it_contended():
    fix = no_model_fixes("m-1", ["rfm", "gbm"])
    assert "rfm" not in fix
    assert fix.startswith("serve it anyway with `hybridflow models promote m-1`")
