"""Executes a notebook headless with nbclient on the "halo" kernel and writes the executed
notebook. Run by kernel/jupyter_test.go (TestQuickstartNotebook), which checks its outputs.

argv: NOTEBOOK OUTPUT WORKDIR
"""
import sys

import nbformat
from nbclient import NotebookClient

src, dst, workdir = sys.argv[1:4]
nb = nbformat.read(src, as_version=4)
client = NotebookClient(nb, kernel_name="halo", timeout=300, resources={"metadata": {"path": workdir}})
client.execute()
nbformat.write(nb, dst)
