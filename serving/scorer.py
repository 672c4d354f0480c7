"""The endpoint's scoring paths: the canonical one (:func:`tasks.ml.models.predict_proba`) and,
where the model's family offers one, a lower-overhead path for single requests (for the MLP, the
same torch kernels without the ``nn.Module`` calls, about 3x faster for one row). The holder
compares the fast path with the canonical one on the warm-up batch and serves the canonical path
if they ever differ."""

from __future__ import annotations

from tasks.ml.models import FittedModel, Scorer, predict_proba


def canonical_scorer(model: FittedModel) -> Scorer:
    """``predict_proba`` bound to ``model``."""
    return lambda x: predict_proba(model, x)


def fast_scorer(model: FittedModel) -> Scorer | None:
    """The family's fast single-request path for ``model``, if it has one."""
    return model.fast_scorer()
