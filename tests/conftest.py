"""Shared fixtures: tiny model pairs built once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def make_pair():
    # Imported here, not at the top: pytest-xdist's controller loads this file too, and torch and
    # transformers take it ~6 s that every run of the suite would wait for.
    from support.pairs import tiny_pair

    return tiny_pair


@pytest.fixture(scope="session")
def saved_tiny_pair(tmp_path_factory):
    """A tiny T5 pair saved as two save_pretrained folders: (small_dir, large_dir)."""
    from pipeline.pairs.tiny import save_pair

    small, large = save_pair(tmp_path_factory.mktemp("tiny-pair"), "t5", small="noisy")
    return str(small), str(large)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance shared by every test that needs it."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ct2_cache(tmp_path_factory):
    """Where models.engine ct2 jobs convert their models, once per session."""
    return str(tmp_path_factory.mktemp("ct2-cache"))


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto) on 127.0.0.1, as s3fs's own tests use."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "testing-access-key",
        "secret": "testing-secret-value-do-not-print",
    }
    server.stop()
