"""Running a compiled program: worker threads and core binding (`threads`), the native stream
runner (`native`), the concurrency-safe memory plan (`memory`), the CPU and CUDA executors
(`executor`), the TVM VM baseline (`vm`) and the kernels paragraph ships (`library`)."""
