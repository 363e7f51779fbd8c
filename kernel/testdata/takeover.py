"""A notebook asking for control while another client holds it is told how to take over.

Run by kernel/jupyter_test.go (TestNotebookTakesOverFromTheREPL). Prints one JSON object: the
error of a control cell refused while a REPL controls the session, and the step count after
%takeover and one more step.
"""
import json

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
    return c["status"], c.get("evalue", ""), result


report = {}
km, kc = start_new_kernel(kernel_name="halo")
try:
    status, evalue, _ = run(kc, "%status")
    report["status_cell"] = status
    status, evalue, _ = run(kc, "%step 1")
    report["refused_status"], report["refused_error"] = status, evalue
    status, evalue, _ = run(kc, "%takeover")
    report["takeover_status"] = status
    status, evalue, _ = run(kc, "%step 1")
    report["step_status"], report["step_error"] = status, evalue
    _, _, step = run(kc, "halo.Status().Step")
    report["step"] = int(step)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=False)
print(json.dumps(report))
