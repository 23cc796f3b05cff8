"""Several Ray nodes: a job whose actors spread over two worker nodes, one of which is killed while it decodes
(raylet and workers SIGKILLed), completes with every id once and no error row, on local and on S3 output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pyarrow.compute as pc
import pytest

from pipeline.io.storage import read_output_table
from support import REPO
from support.jobs import make_job
from support.multinode import RESULT
from support.shards import write_parquet_shards

pytestmark = pytest.mark.slow


def run_on_a_cluster(job, kill: bool) -> dict:
    process = subprocess.run([sys.executable, "-m", "support.multinode", job.model_dump_json(),
                              "--kill" if kill else "--no-kill"], cwd=REPO, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PYTHONPATH": f"{REPO}/tests:{REPO}",
                                                   "RAY_AUTH_MODE": "token"})  # Ray 2.60's default
    assert process.returncode == 0, process.stderr[-4000:]
    line = next(line for line in process.stdout.splitlines() if line.startswith(RESULT))
    return json.loads(line[len(RESULT):])


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_node_killed_mid_job_loses_and_doubles_no_record(store, saved_tiny_pair, tmp_path, request):
    if store == "s3":
        import s3fs

        options = request.getfixturevalue("s3_server")
        bucket = f"multinode-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem(**options, skip_instance_cache=True).mkdir(bucket)
        source, output = f"s3://{bucket}/in", f"s3://{bucket}/out"
    else:
        options, source, output = {}, str(tmp_path / "in"), str(tmp_path / "out")
    # Enough work at batch 1 that the actors still decode when output files exist (the tiny pair is fast).
    ids = write_parquet_shards(source, 600, 8, options)
    job = make_job(saved_tiny_pair, source, output, decoding={"max_new_tokens": 32},
                   input={"storage_options": options},
                   compute={"actors": 2, "batch_size": 1},
                   output={"mode": "overwrite", "rows_per_file": 8, "storage_options": options})

    report = run_on_a_cluster(job, kill=True)
    assert report["killed"], "no worker node held a decode actor with output written: nothing was killed"
    assert report["nodes"] == 3
    table = read_output_table(output, options, columns=["id", "error", "worker"])
    assert sorted(table["id"].to_pylist()) == sorted(ids)  # every id once
    assert table["error"].null_count == len(ids), table.filter(pc.is_valid(table["error"])).to_pylist()[:3]
    assert report["summary"]["errors_now"] == 0
