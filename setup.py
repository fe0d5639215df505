"""The package's build: pyproject.toml holds the metadata; this adds the optional C extension.

``s3stream._native`` (the compiled hot path of the object codecs) is ``optional``: where it cannot
be compiled the install still succeeds and the pure-Python codecs run (see ``s3stream/native.py``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "s3stream._native",
            sources=["s3stream/_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
