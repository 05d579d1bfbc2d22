"""The one thing pyproject.toml cannot say: the optional compiled parts.

``messagebox.predicates._native`` (messagebox/predicates/_native.c, the matcher) and
``messagebox._native`` (messagebox/_native.c, UUIDs for the publish path) are built where
a C compiler and Python's headers are found; where they are not, the install goes on
without them and the same work runs in pure Python (the same results: ``FilterIndex``
matches 4-6x slower, a publish makes its ids ~10% slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "messagebox.predicates._native",
            ["messagebox/predicates/_native.c"],
            optional=True,  # no compiler: install anyway, and match in Python
        ),
        Extension("messagebox._native", ["messagebox/_native.c"], optional=True),
    ]
)
