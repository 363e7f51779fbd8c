"""Cells that end the interpreter process are errors; the kernel goes on serving.

Run by kernel/jupyter_test.go (TestCrashingCellsLeaveTheKernelServing). Prints one JSON object:
for each crashing cell its reply status, ename and evalue, then whether the heartbeat still
echoes and the result of the cells after it.
"""
import json

import zmq
from jupyter_client.manager import start_new_kernel

TIMEOUT = 120


def run(kc, code):
    outputs = []
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=outputs.append)
    c = reply["content"]
    result = None
    for m in outputs:
        if m["msg_type"] == "execute_result":
            result = m["content"]["data"]["text/plain"]
    return {"status": c["status"], "ename": c.get("ename", ""), "evalue": c.get("evalue", ""), "result": result}


def heartbeat(km):
    ci = km.get_connection_info()
    hb = zmq.Context.instance().socket(zmq.REQ)
    hb.setsockopt(zmq.RCVTIMEO, 5000)
    hb.setsockopt(zmq.LINGER, 0)
    hb.connect("tcp://%s:%d" % (ci["ip"], ci["hb_port"]))
    try:
        hb.send(b"ping")
        return hb.recv().decode()
    except zmq.error.Again:
        return None
    finally:
        hb.close()


report = {"cells": []}
km, kc = start_new_kernel(kernel_name="halo")
try:
    run(kc, "func twice(n int) int { return 2 * n }")
    for code in ["func down(n int) int { return down(n+1) + 1 }\ndown(0)",
                 "b := make([]byte, 1<<40)\nb[0] = 1"]:
        r = run(kc, code)
        r["heartbeat"] = heartbeat(km)
        r["after"] = run(kc, "twice(21)")["result"]
        report["cells"].append(r)
    report["alive"] = km.is_alive()
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=False)
print(json.dumps(report))
