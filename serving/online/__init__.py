"""Fresh features at serving time: the per-customer online state (:mod:`serving.online.state`),
the feature formulas evaluated on it (:mod:`serving.online.features`)."""
