"""The background-service supervisor (sweepflow.services.supervisor) with a real process: reuse, and replacement when the
code it runs changed."""

from __future__ import annotations

import os
import sys

from sweepflow.services import supervisor as services


def _http_service(port: int, code_key: str) -> services.ServiceSpec:
    return services.ServiceSpec(
        name="web",
        argv=[sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        health={"kind": "tcp", "address": f"127.0.0.1:{port}"},
        address=f"127.0.0.1:{port}",
        code_key=code_key,
    )


def test_a_service_is_reused_while_its_code_key_matches_and_replaced_when_it_changes(tmp_path):
    state = str(tmp_path)
    port = services.free_port()
    try:
        services.ensure(state, _http_service(port, "v1"))
        first = services.read_record(state, "web")
        services.ensure(state, _http_service(port, "v1"))
        assert services.read_record(state, "web")["pid"] == first["pid"]  # reused
        services.ensure(state, _http_service(port, "v2"))
        second = services.read_record(state, "web")
        assert second["pid"] != first["pid"] and second["code_key"] == "v2"
        try:
            os.kill(first["pid"], 0)
            raise AssertionError("the outdated service is still running")
        except ProcessLookupError:
            pass
    finally:
        services.stop(state, "web")


def test_the_code_fingerprint_follows_a_training_modules_file(tmp_path):
    module = tmp_path / "my_train.py"
    module.write_text("def train(config):\n    pass\n")
    before = services.code_fingerprint(extra_files=[str(module)])
    assert services.code_fingerprint(extra_files=[str(module)]) == before
    module.write_text("def train(config):\n    return 1\n")
    os.utime(module, ns=(1, 1))  # a different mtime and size, as an edit gives
    assert services.code_fingerprint(extra_files=[str(module)]) != before


def test_the_stack_keeps_its_s3_secret_off_the_command_line_and_is_found_after_sourcing_stack_env(tmp_path):
    from sweepflow.flows.config import Settings
    from sweepflow.services import stack

    spec = stack.s3_spec(str(tmp_path), "KEYID", "SECRETVALUE")
    assert not any("SECRETVALUE" in arg for arg in spec.argv)  # argv is readable by every user through `ps`
    assert spec.env["RCLONE_AUTH_KEY"] == '"KEYID,SECRETVALUE"'
    # stack.env sets SWEEPFLOW_HOME=<stack>/home and SWEEPFLOW_STACK_DIR=<stack>: `infra/stack down` after
    # `source stack.env` must find the stack itself, not <stack>/home/stack.
    settings = Settings.from_env({"SWEEPFLOW_HOME": str(tmp_path / "home"), "SWEEPFLOW_STACK_DIR": str(tmp_path)})
    assert stack.default_state_dir(settings.home, settings.stack_dir) == str(tmp_path)
    assert stack.default_state_dir(str(tmp_path / "h")) == str(tmp_path / "h" / "stack")
