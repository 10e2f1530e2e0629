"""paragraph: graph substitution and inter-operator parallelism for Apache TVM (Relax)."""

from setuptools import find_packages, setup

setup(
    name="paragraph",
    version="0.1.0",
    description="Verified graph substitutions and multi-stream execution for Apache TVM",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["paragraph", "paragraph.*"]),
    package_data={"paragraph": ["rules/*.json", "tvm_interop/runtime/*.cc",
                              "tvm_interop/runtime/library/cpp/*"]},
    install_requires=[
        # apache-tvm-ffi 0.1.15.x segfaults in tvm.ir.save_json, which MetaSchedule calls
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy==2.4.6",
        "scipy==1.17.1",
        "networkx==3.6.1",
        "z3-solver==5.4.0.0",
        # MetaSchedule's own needs; xgboost-cpu is the 6 MB wheel that provides `xgboost`
        "psutil==7.2.2",
        "cloudpickle==3.1.2",
        "xgboost-cpu==3.2.0",
        "matplotlib==3.11.2",  # paragraph inspect draws timelines
        "tqdm==4.70.1",  # progress bars of long steps, on a terminal
    ],
    extras_require={
        # tornado: TVM's RPC tracker (the tests start one; clients and servers need none)
        "dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "hypothesis==6.170.15", "ruff==0.17.5",
                "mypy==2.4.1", "tornado==6.6.1"],
        "rpc": ["tornado==6.6.1"],
        "onnx": ["onnx==1.23.2", "onnxruntime==1.31.1"],
        "torch": ["torch==2.13.0"],
        # the CUDA executor's streams, events and graph capture
        "cuda": ["cuda-bindings==13.5.0"],
        # the public-model corpus and its peers (benchmarks/corpus.py, `make corpus`)
        "corpus": ["torchvision==0.28.0", "timm==1.0.31", "transformers==5.24.0",
                   "openvino==2026.4.1"],
    },
    entry_points={"console_scripts": ["paragraph=paragraph.cli:main"]},
)
