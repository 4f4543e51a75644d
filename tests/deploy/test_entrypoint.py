"""docker/entrypoint.sh, run as the images run it (minus tini): its defaults for a container (host,
device, config, model), its refusals (missing model, empty model folder, missing config), the
commands it passes through, and that it execs pagellm so SIGTERM reaches the server, which exits 0.

Most tests run it against a fake `pagellm` (a script recording its arguments, environment and pid);
the last one against the real binary."""
import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request

import pytest

from conftest import GOLDEN_LLAMA, ROOT

ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")

FAKE_PAGELLM = f"""#!{sys.executable}
import json, os, signal, sys, time
def record(**extra):
    with open(os.environ["FAKE_PAGELLM_RECORD"], "w") as f:
        env = {{k: v for k, v in os.environ.items() if k.startswith("PAGELLM_")}}
        json.dump(dict(argv=sys.argv[1:], env=env, pid=os.getpid(), **extra), f)
record()
if os.environ.get("FAKE_PAGELLM_SERVE"):
    def stop(sig, frame):
        record(signal=sig)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("listening", flush=True)
    time.sleep(60)
    sys.exit(3)
"""


@pytest.fixture
def fake(tmp_path):
    """Runs the entrypoint with a fake pagellm first on PATH; returns (exit status, stderr, record)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "pagellm"
    exe.write_text(FAKE_PAGELLM)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record.json"

    def run(*args, env=None, script=ENTRYPOINT):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PAGELLM_")}
        full_env.update(PATH=f"{bindir}:{os.environ['PATH']}", FAKE_PAGELLM_RECORD=str(record))
        full_env.update(env or {})
        if record.exists():
            record.unlink()
        p = subprocess.run(["sh", script, *args], env=full_env, capture_output=True, text=True, timeout=30)
        return p.returncode, p.stderr, json.loads(record.read_text()) if record.exists() else None

    run.bindir = bindir
    return run


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "models" / "Qwen3-8B"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return str(d)


@pytest.fixture
def local_entrypoint(tmp_path):
    """The entrypoint with its fixed paths (/models, /etc/pagellm/config.yaml) moved under tmp_path."""
    text = open(ENTRYPOINT).read()
    paths = {"/models": str(tmp_path / "image-models"), "/etc/pagellm/config.yaml": str(tmp_path / "config.yaml")}
    for old, new in paths.items():
        assert f"={old}\n" in text
        text = text.replace(f"={old}\n", f"={new}\n")
    script = tmp_path / "entrypoint.sh"
    script.write_text(text)
    return str(script), paths


def test_serves_with_container_defaults(fake, model_dir):
    rc, err, rec = fake(env={"PAGELLM_MODEL": model_dir, "PAGELLM_IMAGE_DEVICE": "cuda"})
    assert rc == 0, err
    assert rec["argv"] == ["serve"]
    assert rec["env"]["PAGELLM_HOST"] == "0.0.0.0"
    assert rec["env"]["PAGELLM_DEVICE"] == "cuda"
    assert rec["env"]["PAGELLM_MODEL"] == model_dir


def test_flags_and_environment_win_over_defaults(fake, model_dir):
    rc, err, rec = fake("--model", model_dir, "--host=127.0.0.1", "--port", "9000", "--device", "cpu",
                        env={"PAGELLM_IMAGE_DEVICE": "cuda", "PAGELLM_MAX_NUM_SEQS": "64"})
    assert rc == 0, err
    assert rec["argv"] == ["serve", "--model", model_dir, "--host=127.0.0.1", "--port", "9000", "--device", "cpu"]
    assert "PAGELLM_HOST" not in rec["env"] and "PAGELLM_DEVICE" not in rec["env"]
    assert "PAGELLM_MODEL" not in rec["env"]
    assert rec["env"]["PAGELLM_MAX_NUM_SEQS"] == "64"
    rc, err, rec = fake(env={"PAGELLM_MODEL": model_dir, "PAGELLM_HOST": "::", "PAGELLM_DEVICE": "cpu",
                             "PAGELLM_IMAGE_DEVICE": "cuda"})
    assert rc == 0, err
    assert rec["env"]["PAGELLM_HOST"] == "::" and rec["env"]["PAGELLM_DEVICE"] == "cpu"


def test_explicit_serve_command(fake, model_dir):
    for args in (["serve"], ["pagellm", "serve"]):
        rc, err, rec = fake(*args, "--port", "9000", env={"PAGELLM_MODEL": model_dir})
        assert rc == 0, err
        assert rec["argv"] == ["serve", "--port", "9000"] and rec["env"]["PAGELLM_HOST"] == "0.0.0.0"


def test_other_commands_run_as_given(fake):
    rc, err, rec = fake("pagellm", "inspect", "--model", "/nonexistent")
    assert rc == 0, err
    assert rec["argv"] == ["inspect", "--model", "/nonexistent"] and rec["env"] == {}
    rc, err, rec = fake("--version")
    assert rc == 0 and rec["argv"] == ["--version"]
    rc, err, rec = fake("--help")
    assert rc == 0 and rec["argv"] == ["serve", "--help"]


def test_missing_model_is_refused(fake, local_entrypoint, tmp_path):
    script, paths = local_entrypoint
    rc, err, rec = fake(script=script)
    assert rc == 2 and rec is None
    assert f"model path '{paths['/models']}' does not exist" in err
    assert "Mount the model read-only" in err and "PAGELLM_MODEL" in err
    rc, err, rec = fake("--model=/nonexistent/Qwen3-8B")
    assert rc == 2 and rec is None and "'/nonexistent/Qwen3-8B' does not exist" in err
    rc, err, rec = fake(env={"PAGELLM_MODEL": "/nonexistent/model.gguf"})
    assert rc == 2 and rec is None and "'/nonexistent/model.gguf' does not exist" in err


def test_model_folder_without_weights_is_refused(fake, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, err, rec = fake(env={"PAGELLM_MODEL": str(empty)})
    assert rc == 2 and rec is None and "neither config.json nor a .gguf file" in err
    (empty / "model.Q4_1.gguf").write_bytes(b"GGUF")
    rc, err, rec = fake(env={"PAGELLM_MODEL": str(empty)})
    assert rc == 0, err
    rc, err, rec = fake("--model", str(empty / "model.Q4_1.gguf"))
    assert rc == 0, err


def test_default_model_folder(fake, local_entrypoint):
    script, paths = local_entrypoint
    os.makedirs(paths["/models"])
    open(os.path.join(paths["/models"], "config.json"), "w").close()
    rc, err, rec = fake(script=script)
    assert rc == 0, err
    assert rec["env"]["PAGELLM_MODEL"] == paths["/models"]


def test_config_file(fake, local_entrypoint, model_dir, tmp_path):
    script, paths = local_entrypoint
    config = paths["/etc/pagellm/config.yaml"]
    # The default config file is passed with --config; its host and model keys count as set.
    with open(config, "w") as f:
        f.write(f'host: "::"   # dual stack\nmodel: {model_dir}\nmax-num-seqs: 32\n')
    rc, err, rec = fake(script=script)
    assert rc == 0, err
    assert rec["argv"] == ["serve", "--config", config]
    assert "PAGELLM_HOST" not in rec["env"] and "PAGELLM_MODEL" not in rec["env"]
    # A model the config names is checked like the others.
    with open(config, "w") as f:
        f.write("model: '/nonexistent/from-config'\n")
    rc, err, rec = fake(script=script)
    assert rc == 2 and "'/nonexistent/from-config' does not exist" in err
    # JSON config files, given by flag or by PAGELLM_CONFIG.
    other = tmp_path / "pagellm.json"
    other.write_text(json.dumps({"model": "/nonexistent/from-json", "port": 9000}))
    for args, env in ((["--config", str(other)], {}), ([], {"PAGELLM_CONFIG": str(other)})):
        rc, err, rec = fake(*args, env=env, script=script)
        assert rc == 2 and "'/nonexistent/from-json' does not exist" in err
    other.write_text(json.dumps({"model": model_dir}))
    rc, err, rec = fake(f"--config={other}", script=script)
    assert rc == 0, err
    assert rec["argv"] == ["serve", f"--config={other}"] and rec["env"]["PAGELLM_HOST"] == "0.0.0.0"


def test_missing_config_file_is_refused(fake, model_dir):
    rc, err, rec = fake("--config", "/nonexistent/pagellm.yaml", env={"PAGELLM_MODEL": model_dir})
    assert rc == 2 and rec is None and "config file '/nonexistent/pagellm.yaml' does not exist" in err


def test_sigterm_reaches_the_server(fake, model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGELLM_")}
    env.update(PATH=f"{fake.bindir}:{os.environ['PATH']}", FAKE_PAGELLM_RECORD=str(tmp_path / "serve.json"),
               FAKE_PAGELLM_SERVE="1", PAGELLM_MODEL=model_dir)
    p = subprocess.Popen(["sh", ENTRYPOINT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "listening"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()
    rec = json.loads((tmp_path / "serve.json").read_text())
    assert rec["signal"] == signal.SIGTERM
    assert rec["pid"] == p.pid  # exec: the server is the process the container runtime signals


def test_real_server_drains_and_exits_0(pagellm_bin, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(pagellm_bin, bindir / "pagellm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGELLM_")}
    env.update(PATH=f"{bindir}:{os.environ['PATH']}", PAGELLM_MODEL=GOLDEN_LLAMA, PAGELLM_HOST="127.0.0.1")
    log = open(tmp_path / "serve.log", "w+")
    p = subprocess.Popen(["sh", ENTRYPOINT, "--port", "0", "--kv-cache-memory", str(32 << 20)], env=env,
                         stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[2].rstrip(",")
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        assert os.path.realpath(f"/proc/{p.pid}/exe") == os.path.realpath(pagellm_bin)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    log.seek(0)
    text = log.read()
    assert "draining" in text and "stopped" in text, text[-2000:]
