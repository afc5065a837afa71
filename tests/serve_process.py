"""`blendserve --config <yaml> [args] serve --port 0` as a child process, for the Python
tests that drive it with the official OpenAI client: a temp dir holds its config,
data and log; the constructor returns once the server said where it listens (or
raises with its log), stop() ends it (SIGTERM, SIGKILL after 60 s) and removes the
dir."""
import os
import re
import shutil
import subprocess
import tempfile
import time


class ServeProcess:
    def __init__(self, binary, config_text, prefix="bs_serve_", args=()):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(config_text)
        env = dict(os.environ, BLENDSERVE_DATA_DIR=os.path.join(self.dir, "data"))
        self.log = open(os.path.join(self.dir, "stderr.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "--config", config, *args, "serve", "--port", "0"], stderr=self.log, stdout=self.log, env=env
        )
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.stderr())
            m = re.search(r"serving on http://127\.0\.0\.1:(\d+)", self.stderr())
            if m:
                self.port = int(m.group(1))
            time.sleep(0.1)
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start")
        self.base = "http://127.0.0.1:%d" % self.port

    def stderr(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
