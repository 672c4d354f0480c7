"""Model families behind one seam (see :mod:`tasks.ml.models.base` for the protocol).

Callers use only what is exported here: find a family by kind, fit it, load any bundle by the
kind it records, score with :func:`predict_proba`. One module per family (``mlp.py``, ...),
registered by kind in :mod:`tasks.ml.models.registry`.
"""

from tasks.ml.models.base import (
    CONFIG_FILE,
    CostHints,
    FamilySpec,
    FitJob,
    FitOutcome,
    FittedModel,
    ModelFamily,
    Scorer,
    evaluate,
    fit_threads,
    predict_proba,
    split_arrays,
)
from tasks.ml.models.registry import (
    LEGACY_KIND,
    bundle_kind,
    family_specs,
    get_family,
    list_families,
    load_model,
    register_family,
    spec_adapter,
    unregister_family,
    verify_bundle,
)

__all__ = [
    "CONFIG_FILE",
    "LEGACY_KIND",
    "CostHints",
    "FamilySpec",
    "FitJob",
    "FitOutcome",
    "FittedModel",
    "ModelFamily",
    "Scorer",
    "bundle_kind",
    "evaluate",
    "family_specs",
    "fit_threads",
    "get_family",
    "list_families",
    "load_model",
    "predict_proba",
    "register_family",
    "spec_adapter",
    "split_arrays",
    "unregister_family",
    "verify_bundle",
]
