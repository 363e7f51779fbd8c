"""A kernel restart keeps the session's step count; a tampered message gets no answer.

Run by kernel/jupyter_test.go (TestRestartKeepsSessionStepCount). Prints one JSON object.
argv[1] is the config to load into the session.
"""
import json
import sys
from queue import Empty

import zmq
from jupyter_client.manager import start_new_kernel
from jupyter_client.session import Session

TIMEOUT = 120


def run(kc, code):
    outputs = []
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=outputs.append)
    c = reply["content"]
    if c["status"] != "ok":
        raise SystemExit("cell %r failed: %s: %s" % (code, c.get("ename"), c.get("evalue")))
    for m in outputs:
        if m["msg_type"] == "execute_result":
            return m["content"]["data"]["text/plain"]
    return None


config = sys.argv[1]
report = {}
km, kc = start_new_kernel(kernel_name="halo")
try:
    # The heartbeat echoes (a libzmq REQ socket, as Jupyter's heartbeat channel uses).
    ci = km.get_connection_info()
    hb = zmq.Context.instance().socket(zmq.REQ)
    hb.setsockopt(zmq.RCVTIMEO, 5000)
    hb.setsockopt(zmq.LINGER, 0)
    hb.connect("tcp://%s:%d" % (ci["ip"], ci["hb_port"]))
    hb.send(b"ping-halo")
    report["heartbeat"] = hb.recv().decode()
    hb.close()

    run(kc, "%load " + config)
    run(kc, "%step 3")
    report["before"] = int(run(kc, "halo.Status().Step"))

    # A message signed with the wrong key is dropped: no reply, and the kernel goes on.
    bad = Session(key=b"not-the-key", username="mallory")
    bad.send(kc.shell_channel.socket, "execute_request",
             {"code": "%step 5", "silent": False, "store_history": True,
              "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    try:
        msg = kc.get_shell_msg(timeout=3)
        report["tampered_reply"] = msg["msg_type"]
    except Empty:
        report["tampered_reply"] = None
    report["after_tampered"] = int(run(kc, "halo.Status().Step"))

    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=60)
    report["after_restart"] = int(run(kc, "halo.Status().Step"))
    # The restarted kernel still controls the session: it can step.
    run(kc, "%step 2")
    report["after_restart_step"] = int(run(kc, "halo.Status().Step"))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=False)
print(json.dumps(report))
