"""A batch of events summed per customer: what applying it changes in the online state,
computed from the events alone (no lock, no state), so that the state's lock is held only for
the few scatter updates that add these sums in (:meth:`serving.online.state.OnlineState.apply_delta`).

The events are ordered by customer and time once; each customer's events are a run (a group)
and the sums are per group: counts, amounts, first and last times, the gaps between the group's
own consecutive purchases (count, mean, sum of squared deviations, maximum), per (group, UTC
day) cells for the ring of daily buckets and per (group, value) cells for the mix columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.online.events import DAY_US, NO_TIME, EventArrays
from tasks.definitions.feature_specs import DAY_MICROS, EVENT_TYPE_MIX

KINDS = len(EVENT_TYPE_MIX)


@dataclass(frozen=True)
class MixCells:
    """Events per (group, value) of one mix column: ``values`` the column's distinct texts,
    ``value`` a code into them; sorted by group."""

    values: list[str]
    group: np.ndarray
    value: np.ndarray
    count: np.ndarray


@dataclass(frozen=True)
class Delta:
    """Per-customer sums of a batch of events (one element per group, groups in customer code
    order; cells sorted by group)."""

    customers: list[str]  # the customer ids the codes index
    group_code: np.ndarray  # each group's customer code
    first_event: np.ndarray  # each group's first event's position in the batch
    first_t: np.ndarray
    last_t: np.ndarray
    n: np.ndarray
    n_p: np.ndarray
    n_kind: np.ndarray  # groups x EVENT_TYPE_MIX
    amount: np.ndarray  # purchase amounts
    q_sum: np.ndarray  # purchase quantities
    q_max: np.ndarray  # -inf without a purchase
    first_p_t: np.ndarray  # NO_TIME without a purchase
    last_p_t: np.ndarray
    gap_k: np.ndarray  # gaps between the group's own consecutive purchases (days)
    gap_mean: np.ndarray
    gap_m2: np.ndarray
    gap_max: np.ndarray
    cell_group: np.ndarray  # one cell per (group, UTC day)
    cell_day: np.ndarray
    cell_n: np.ndarray
    cell_n_p: np.ndarray
    cell_amount: np.ndarray
    mix: dict[str, MixCells]
    events: int
    newest: int  # the latest event time (NO_TIME for no events)

    @property
    def groups(self) -> int:
        return len(self.group_code)


def delta_of(events: EventArrays) -> Delta:
    """The per-customer sums of ``events`` (any order)."""
    size = events.size
    order = _customer_time_order(events)
    code = events.customer.codes[order]
    t = events.t[order]
    purchase = events.purchase[order]
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if size else np.zeros(0, int)
    bounds = np.r_[starts, size]
    n = np.diff(bounds)
    groups = len(starts)
    group = np.repeat(np.arange(groups), n)
    amount = np.where(purchase, events.amount[order], 0.0)
    quantity = events.quantity[order]
    kind = events.kind[order].astype(np.int64)
    typed = kind >= 0
    n_kind = np.bincount(group[typed] * KINDS + kind[typed], minlength=groups * KINDS).reshape(
        groups, KINDS
    )
    gaps = _purchase_gaps(group, t, purchase, groups)
    cells = _day_cells(group, t, purchase, amount)
    if size:
        sums = np.add.reduceat(
            np.stack([purchase.astype(np.float64), amount, np.where(purchase, quantity, 0.0)]),
            starts,
            axis=1,
        )
        q_max = np.maximum.reduceat(np.where(purchase, quantity, -np.inf), starts)
        first_t, last_t = t[starts], t[bounds[1:] - 1]
    else:
        sums, q_max = np.zeros((3, 0)), np.zeros(0)
        first_t = last_t = np.zeros(0, dtype=np.int64)
    return Delta(
        customers=events.customer.values,
        group_code=code[starts].astype(np.int64),
        first_event=order[starts],
        first_t=first_t,
        last_t=last_t,
        n=n,
        n_p=sums[0].astype(np.int64),
        n_kind=n_kind,
        amount=sums[1],
        q_sum=sums[2],
        q_max=q_max,
        **gaps,
        **cells,
        mix={
            col: _mix_cells(values.codes[order], values.values, group)
            for col, values in events.mix.items()
        },
        events=size,
        newest=int(t.max()) if size else NO_TIME,
    )


def _customer_time_order(events: EventArrays) -> np.ndarray:
    """Positions of the events by customer, then time. Batches come in time order: then a
    stable sort by customer (a radix sort for up to 65,536 customers) is enough."""
    codes = events.customer.codes
    if not bool((events.t[1:] >= events.t[:-1]).all()):
        return np.lexsort((events.t, codes))
    if len(events.customer.values) <= 1 << 16:
        codes = codes.astype(np.uint16)
    return np.argsort(codes, kind="stable")


def _purchase_gaps(
    group: np.ndarray, t: np.ndarray, purchase: np.ndarray, groups: int
) -> dict[str, np.ndarray]:
    """Each group's first and last purchase time and the running count/mean/M2/max of the gaps
    (days) between its consecutive purchases (events in group and time order)."""
    p_group, p_t = group[purchase], t[purchase]
    first_p_t = np.full(groups, NO_TIME, dtype=np.int64)
    last_p_t = np.full(groups, NO_TIME, dtype=np.int64)
    same = p_group[1:] == p_group[:-1]
    if p_t.size:  # a group's purchases are a run
        runs = np.flatnonzero(np.r_[True, ~same])
        first_p_t[p_group[runs]] = p_t[runs]
        last_p_t[p_group[runs]] = p_t[np.r_[runs[1:], p_t.size] - 1]
    gaps = ((p_t[1:] - p_t[:-1]) / DAY_MICROS)[same]
    gap_group = p_group[1:][same]
    k = np.bincount(gap_group, minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(gap_group, weights=gaps, minlength=groups) / k
    mean[k == 0] = 0.0
    m2 = np.bincount(gap_group, weights=(gaps - mean[gap_group]) ** 2, minlength=groups)
    gap_max = np.full(groups, -np.inf)
    if gaps.size:
        runs = np.flatnonzero(np.r_[True, gap_group[1:] != gap_group[:-1]])
        gap_max[gap_group[runs]] = np.maximum.reduceat(gaps, runs)
    return {
        "first_p_t": first_p_t,
        "last_p_t": last_p_t,
        "gap_k": k,
        "gap_mean": mean,
        "gap_m2": m2,
        "gap_max": gap_max,
    }


def _day_cells(
    group: np.ndarray, t: np.ndarray, purchase: np.ndarray, amount: np.ndarray
) -> dict[str, np.ndarray]:
    """Events, purchases and purchase amount per (group, UTC day) (events in group and time
    order, so a cell is a run)."""
    day = t // DAY_US
    if not day.size:
        empty = np.zeros(0, dtype=np.int64)
        return {
            "cell_group": empty,
            "cell_day": empty,
            "cell_n": empty,
            "cell_n_p": empty,
            "cell_amount": np.zeros(0),
        }
    starts = np.flatnonzero(np.r_[True, (group[1:] != group[:-1]) | (day[1:] != day[:-1])])
    sums = np.add.reduceat(np.stack([purchase.astype(np.float64), amount]), starts, axis=1)
    return {
        "cell_group": group[starts],
        "cell_day": day[starts],
        "cell_n": np.diff(np.r_[starts, day.size]),
        "cell_n_p": sums[0].astype(np.int64),
        "cell_amount": sums[1],
    }


def _mix_cells(codes: np.ndarray, values: list[str], group: np.ndarray) -> MixCells:
    """Events per (group, value), sorted by group (by counting into a dense groups x values
    table when it is no larger than a few times the events, else by sorting)."""
    valid = codes >= 0
    width = max(len(values), 1)
    keys = group[valid] * width + codes[valid]
    groups = int(group[-1]) + 1 if group.size else 0
    if groups * width <= 4 * max(keys.size, 1):
        counts = np.bincount(keys, minlength=groups * width)
        cells = np.flatnonzero(counts)
        count = counts[cells]
    else:
        cells, count = np.unique(keys, return_counts=True)
    return MixCells(values, cells // width, cells % width, count)
