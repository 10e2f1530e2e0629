"""The graph algorithms of the pure core (no TVM): schedules (`schedule`), the IOS dynamic
program and search (`ios`), lone-convolution splitting (`split`); later the substitution
search, its costs and partition."""
