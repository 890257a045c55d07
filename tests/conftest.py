"""Shared set-up for the test suite.

Kernels started by the tests (nbval, the student-edition checks) inherit this process's
environment. matplotlib's inline backend is what puts figures into a notebook's outputs; with
``MPLBACKEND=Agg`` (a common headless default) ``plt.show()`` displays nothing and every stored
figure would go missing from the comparison, so the kernels get the inline backend explicitly.
"""

import os

os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
