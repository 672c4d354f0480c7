"""What a Spark Connect client ships and asks: the code archive, the remote URL, and the
questions a classic session answers from its SparkContext."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from infra.compute.spark_connect import (
    code_archive,
    connect_session,
    default_parallelism,
    is_connect,
    runs_on_cluster,
    shared_session_url,
)
from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings


def _fake_project(root):
    (root / "tasks" / "data").mkdir(parents=True)
    (root / "tasks" / "__init__.py").write_text("")
    (root / "tasks" / "data" / "rules.py").write_text("ANSWER = 42\n")  # a namespace package
    (root / "infra").mkdir()
    (root / "infra" / "__init__.py").write_text("")
    (root / "infra" / "__pycache__").mkdir()
    (root / "infra" / "__pycache__" / "junk.py").write_text("")
    return root


def test_code_archive_is_importable_and_named_by_its_content(tmp_path):
    root = _fake_project(tmp_path / "project")
    archive = code_archive(tmp_path / "out", root)
    names = zipfile.ZipFile(archive).namelist()
    assert "tasks/data/rules.py" in names and "tasks/data/" in names
    assert not any("__pycache__" in n for n in names)
    probe = "import tasks.data.rules as r; print(r.ANSWER)"
    env = {"PYTHONPATH": str(archive)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.stdout.strip() == "42", out.stderr

    assert code_archive(tmp_path / "out", root) == archive, "same code, same archive"
    (root / "tasks" / "data" / "rules.py").write_text("ANSWER = 43\n")
    changed = code_archive(tmp_path / "out", root)
    assert changed != archive and changed.name.startswith("hybridflow-code-")


def test_the_project_archive_holds_what_executors_import(tmp_path):
    names = zipfile.ZipFile(code_archive(tmp_path)).namelist()
    for module in (
        "tasks/ml/scoring_worker.py",
        "tasks/ml/models/mlp.py",
        "infra/storage/store.py",
    ):
        assert module in names
    assert not any(n.startswith(("cli/", "flows/", "serving/", "tests/")) for n in names)


@pytest.mark.parametrize("remote", ["spark://127.0.0.1:7077", "127.0.0.1:15002", "http://x"])
def test_a_remote_that_is_not_a_connect_url_is_refused(remote, tmp_path):
    settings = HybridflowSettings(spark_remote=remote, work_dir=tmp_path)
    with pytest.raises(HybridflowInputError, match="sc://host:port"):
        connect_session(settings, {})


def test_a_classic_local_session_is_neither_connect_nor_a_cluster(spark):
    assert not is_connect(spark)
    assert not runs_on_cluster(spark)
    assert default_parallelism(spark) == spark.sparkContext.defaultParallelism


def test_clients_of_one_code_version_share_one_session(tmp_path):
    first = tmp_path / "hybridflow-code-aaaa.zip"
    other = tmp_path / "hybridflow-code-bbbb.zip"
    url = shared_session_url("sc://127.0.0.1:15002", first)
    assert url.startswith("sc://127.0.0.1:15002/;session_id=")
    assert url == shared_session_url("sc://127.0.0.1:15002", first), "same code, same session"
    assert url != shared_session_url("sc://127.0.0.1:15002", other)
    assert url != shared_session_url("sc://10.0.0.5:15002", first)
    with_params = shared_session_url("sc://h:1/;use_ssl=true", first)
    assert with_params.startswith("sc://h:1/;use_ssl=true;session_id=")
    chosen = "sc://h:1/;session_id=6c3f7a3e-0000-4000-8000-000000000000"
    assert shared_session_url(chosen, first) == chosen, "a session the user names is kept"
