import pyarrow.parquet as pq

from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.definitions.contract import CONTRACT_COLUMNS


def test_deterministic_for_a_seed(tmp_path):
    params = DemoDataParams(customers=500, days=120, seed=3, customers_per_file=1000)
    a = generate_demo_events(params, tmp_path / "a")
    b = generate_demo_events(params, tmp_path / "b")
    ta, tb = pq.read_table(tmp_path / "a"), pq.read_table(tmp_path / "b")
    assert a.events == b.events and ta.equals(tb)
    other = pq.read_table(
        generate_demo_events(params.model_copy(update={"seed": 4}), tmp_path / "c").path
    )
    assert not ta.equals(other)


def test_follows_the_contract_and_plants_bad_rows(tmp_path):
    s = generate_demo_events(
        DemoDataParams(customers=2000, days=200, seed=1, bad_row_fraction=0.01), tmp_path / "e"
    )
    t = pq.read_table(s.path).to_pandas()
    assert set(CONTRACT_COLUMNS) <= set(t.columns)
    assert set(t.event_type) == {"purchase", "view", "add_to_cart", "return"}
    assert t.customer_id.isna().sum() > 0
    assert (t.amount < 0).sum() > 0
    assert t.duplicated().sum() > 0
    assert s.bad_rows > 0 and s.events == len(t)


def test_chunks_do_not_change_the_customer_count(tmp_path):
    s = generate_demo_events(
        DemoDataParams(
            customers=2500, days=60, seed=2, customers_per_file=1000, bad_row_fraction=0
        ),
        tmp_path / "e",
    )
    t = pq.read_table(s.path)
    assert s.files == 3
    assert t.column("customer_id").to_pandas().nunique() == 2500


def test_a_planted_shift_changes_purchase_rate_and_channel_mix_after_its_date(tmp_path):
    import datetime as dt

    base = DemoDataParams(customers=3000, days=200, seed=5, bad_row_fraction=0)
    shift = dt.date(2025, 10, 1)
    shifted = base.model_copy(update={"shift_after": shift})
    plain = pq.read_table(generate_demo_events(base, tmp_path / "plain").path).to_pandas()
    moved = pq.read_table(generate_demo_events(shifted, tmp_path / "moved").path).to_pandas()
    cut = dt.datetime(2025, 10, 2, tzinfo=dt.UTC)

    def per_day(t, event_type, after):
        sel = t[(t.event_type == event_type) & ((t.event_time >= cut) == after)]
        return len(sel)

    # before the date the two logs behave alike; after it purchases are about twice as frequent
    before_ratio = per_day(moved, "purchase", False) / per_day(plain, "purchase", False)
    after_ratio = per_day(moved, "purchase", True) / per_day(plain, "purchase", True)
    assert 0.85 < before_ratio < 1.15 and 1.6 < after_ratio < 2.4, (before_ratio, after_ratio)
    views_ratio = per_day(moved, "view", True) / per_day(plain, "view", True)
    assert 0.85 < views_ratio < 1.15, "only purchases and returns change"

    def app_share(t, after):
        return ((t.channel == "app") & ((t.event_time >= cut) == after)).sum() / (
            (t.event_time >= cut) == after
        ).sum()

    assert abs(app_share(moved, False) - app_share(plain, False)) < 0.03
    assert app_share(moved, True) > app_share(plain, True) + 0.25
