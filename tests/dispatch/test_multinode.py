"""A 2-node cluster simulated with ray.cluster_utils.Cluster: one placement group per node.

Runs in a child process (its own Ray cluster), so it does not touch the session's Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_two_node_pool_places_one_bundle_group_per_node_in_stable_order():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_DEDUP_LOGS="0")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.dispatch.multinode_script"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(lines[0][len("RESULT ") :])
    first, second = result["runs"]
    assert len(set(first["pg_nodes"])) == 2
    assert set(first["pg_nodes"]) == set(result["cluster_nodes"])
    # ranks 0,1 on the first group's node, ranks 2,3 on the second; bundle index = local rank
    assert first["rank_node"] == [first["pg_nodes"][0]] * 2 + [first["pg_nodes"][1]] * 2
    assert first["local_ranks"] == [0, 1, 0, 1]
    assert first["coords"] == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    # one representative per DP group: rows 0-2 from rank 0, rows 3-5 from rank 2
    assert first["tag_rank"] == [0, 0, 0, 2, 2, 2]
    # a second pool on the same cluster gives the same node per rank
    assert second["rank_node"] == first["rank_node"]
