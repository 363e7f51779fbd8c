"""Jupyter kernel conformance suite for halo-shell's kernel ("halo"), on jupyter_kernel_test.

Run by kernel/jupyter_test.go (TestConformance) with JUPYTER_PATH pointing at a kernelspec
installed from a freshly built binary. None of these cells touches an engine session.
"""
import unittest

import jupyter_kernel_test


class HaloKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = "halo"
    language_name = "go"
    file_extension = ".go"

    code_hello_world = 'fmt.Println("hello, world")'
    code_stderr = 'import "os"\nfmt.Fprintln(os.Stderr, "to stderr")'

    completion_samples = [
        {"text": "fmt.Prin", "matches": {"Print", "Printf", "Println"}},
        {"text": "%st", "matches": {"%status", "%step"}},
    ]

    complete_code_samples = ["x := 1", "%step 5", "func f() {\n}", 'fmt.Println("}")']
    incomplete_code_samples = ["for {", "f(1,", "s := `raw"]
    invalid_code_samples = ["x := (1]", "}"]

    code_generate_error = "undefined_name + 1"

    code_execute_result = [
        {"code": "1+2", "result": "3"},
        {"code": "6*7", "result": "42"},
    ]
    code_history_pattern = "1?2"
    supported_history_operations = ("tail", "range", "search")

    code_display_data = [
        {"code": 'halo.Display(halo.PlotLines("squares", nil, []float64{0, 1, 4, 9}))', "mime": "image/png"},
        {"code": 'halo.Display(halo.PlotLines("squares", nil, []float64{0, 1, 4, 9}))', "mime": "image/svg+xml"},
    ]

    code_inspect_sample = "%step"


if __name__ == "__main__":
    unittest.main(verbosity=2)
