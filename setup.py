"""The one thing pyproject.toml cannot say: the optional compiled matcher.

``messagebox.predicates._native`` (predicates/_native.c) is built where a C compiler
and Python's headers are found; where they are not, the install goes on without it and
``FilterIndex`` matches in pure Python (the same results, 4-6x slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "messagebox.predicates._native",
            ["predicates/_native.c"],
            optional=True,  # no compiler: install anyway, and match in Python
        )
    ]
)
