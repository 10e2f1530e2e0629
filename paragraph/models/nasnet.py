"""NASNet-A (Zoph et al., "Learning Transferable Architectures for Scalable Image Recognition",
CVPR 2018) in the layout of Cadene's pretrained-models.pytorch ports `nasnet_mobile.py`
(NASNet-A Mobile 4@1056, 224x224) and `nasnet.py` (NASNet-A Large 6@4032, 331x331).

The ports emulate TensorFlow's "SAME" padding before some stride-2 ops with
ZeroPad2d((1, 0, 1, 0)) + op + slice [1:, 1:] ("shifted" below). Here each such triple is one
conv/pool with the equivalent asymmetric padding (top/left p-1, bottom/right p for a stride-2
k=2p+1 conv; 0 and 1 for the 3x3 pools), which gives bit-for-bit the same windows and output
size; at stride 1 the triple is a plain symmetric conv. The factorized reduction keeps the
ports' shape: ReLU, then two 1x1 paths over avg_pool(1, stride 2), the second on the input
shifted by one pixel (slice [1:, 1:] + zero padding at the far edge), concatenated, then BN.
"""

from __future__ import annotations

from tvm import relax

from ._builder import BN_MOMENT_GAIN, Net

BN_EPS = 1e-3  # the ports' BatchNorm2d(eps=0.001), from TF-slim
NUM_CLASSES = 1000
# Gain of the 1x1 convs where a cell takes its inputs in. A cell's output concatenates two-way
# sums of branches that each keep their input's scale, i.e. has about twice the second moment
# of its inputs; gain 1 (instead of He's 2 after a ReLU) halves it back, so 20 stacked cells
# neither blow up nor vanish.
ENTRY_GAIN = 1.0


def _relu_conv_bn(net: Net, x: relax.Expr, out_ch: int) -> relax.Var:
    return net.conv_bn(net.relu(x), out_ch, 1, gain=ENTRY_GAIN, eps=BN_EPS)


def _separable_bn(net: Net, x: relax.Expr, out_ch: int, kernel: int, stride: int,
                  padding: int | tuple[int, int, int, int]) -> relax.Var:
    """SeparableConv2d (depthwise kxk with groups = channels, pointwise 1x1, no bias), BN."""
    c = net.shape(x)[1]
    y = net.conv(x, c, kernel, stride, padding, groups=c)
    return net.conv_bn(y, out_ch, 1, gain=1.0, eps=BN_EPS)


def _branch(net: Net, x: relax.Expr, out_ch: int, kernel: int, stride: int,
            shifted: bool) -> relax.Var:
    """BranchSeparables: ReLU, separable (strided), BN, ReLU, separable, BN."""
    p = kernel // 2
    first_pad = (p - 1, p - 1, p, p) if shifted and stride == 2 else p
    y = _separable_bn(net, net.relu(x), out_ch, kernel, stride, first_pad)
    return _separable_bn(net, net.relu(y), out_ch, kernel, 1, p)


def _factorized_reduction(net: Net, x: relax.Expr, out_ch: int) -> relax.Var:
    """Halve the resolution with two 1x1 stride-2 paths, the second shifted by one pixel, so
    that together they see every pixel; concat, BN."""
    x = net.relu(x)
    _, _, h, w = net.shape(x)
    gain = ENTRY_GAIN / BN_MOMENT_GAIN  # the BN comes after the concat: no conv_bn
    path1 = net.conv(net.avg_pool(x, 1, 2), out_ch // 2, 1, gain=gain)
    shifted = net.slice(x, [2, 3], [1, 1], [h, w])
    # pad 1 at bottom/right = the port's ZeroPad2d((0, 1, 0, 1)); a 1x1 window there yields 0
    path2 = net.conv(net.avg_pool(shifted, 1, 2, (0, 0, 1, 1), count_include_pad=True),
                     out_ch // 2, 1, gain=gain)
    return net.batch_norm(net.concat([path1, path2]), BN_EPS)


def _reduction_combs(net: Net, a: relax.Expr, b: relax.Expr, f: int, shifted: bool) -> relax.Var:
    """The five combinations of CellStem0/1 and ReductionCell0/1; `a` feeds the pools and the
    5x5 of comb0. Output: concat(comb1..comb4), half resolution, 4*f channels."""
    pool_pad = (0, 0, 1, 1) if shifted else 1
    comb0 = net.add(_branch(net, a, f, 5, 2, shifted), _branch(net, b, f, 7, 2, shifted))
    comb1 = net.add(net.max_pool(a, 3, 2, pool_pad), _branch(net, b, f, 7, 2, shifted))
    comb2 = net.add(net.avg_pool(a, 3, 2, pool_pad, count_include_pad=False),
                    _branch(net, b, f, 5, 2, shifted))
    comb3 = net.add(net.avg_pool(comb0, 3, 1, 1, count_include_pad=False), comb1)
    comb4 = net.add(_branch(net, comb0, f, 3, 1, shifted), net.max_pool(a, 3, 2, pool_pad))
    return net.concat([comb1, comb2, comb3, comb4])


def _reduction_cell(net: Net, x: relax.Expr, x_prev: relax.Expr, f: int,
                    shifted: bool) -> relax.Var:
    x_left = _relu_conv_bn(net, x_prev, f)
    x_right = _relu_conv_bn(net, x, f)
    return _reduction_combs(net, x_right, x_left, f, shifted)


def _normal_cell(net: Net, x: relax.Expr, x_prev: relax.Expr, f: int, first: bool) -> relax.Var:
    """NormalCell, or FirstCell (first=True) whose x_prev is at twice the resolution."""
    if first:
        x_left = _factorized_reduction(net, x_prev, f)
    else:
        x_left = _relu_conv_bn(net, x_prev, f)
    x_right = _relu_conv_bn(net, x, f)

    def avg3(y: relax.Expr) -> relax.Var:
        return net.avg_pool(y, 3, 1, 1, count_include_pad=False)

    comb0 = net.add(_branch(net, x_right, f, 5, 1, False), _branch(net, x_left, f, 3, 1, False))
    comb1 = net.add(_branch(net, x_left, f, 5, 1, False), _branch(net, x_left, f, 3, 1, False))
    comb2 = net.add(avg3(x_right), x_left)
    comb3 = net.add(avg3(x_left), avg3(x_left))
    comb4 = net.add(_branch(net, x_right, f, 3, 1, False), x_right)
    return net.concat([x_left, comb0, comb1, comb2, comb3, comb4])


def _nasnet(net: Net, x: relax.Var, stem_filters: int, filters: int, cells_per_stack: int,
            large: bool) -> relax.Var:
    """Stem, two stem cells, three stacks of normal cells with reduction cells in between.

    `filters` = penultimate_filters // 24. The ports differ in two ways, both kept: Mobile
    shifts ("SAME" padding) in CellStem1 and both reduction cells, Large only in
    ReductionCell0; and Large feeds the cell after a reduction the input from before the
    reduction's own inputs (TF's skip_reduction_layer_input).
    """
    x_conv0 = net.conv_bn(x, stem_filters, 3, 2, gain=1.0, eps=BN_EPS)
    stem0 = _reduction_combs(net, _relu_conv_bn(net, x_conv0, filters // 4), x_conv0,
                             filters // 4, shifted=False)
    stem1 = _reduction_combs(net, _relu_conv_bn(net, stem0, filters // 2),
                             _factorized_reduction(net, x_conv0, filters // 2),
                             filters // 2, shifted=not large)
    prev, cur = stem0, stem1
    for stack in range(3):
        f = filters << stack
        if stack > 0:
            reduced = _reduction_cell(net, cur, prev, f, shifted=stack == 1 or not large)
            prev, cur = (prev if large else cur), reduced
        for i in range(cells_per_stack):
            prev, cur = cur, _normal_cell(net, cur, prev, f, first=i == 0)
    return net.dense(net.global_pool(net.relu(cur)), NUM_CLASSES)


def nasnet_a_mobile(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """NASNet-A Mobile (4 @ 1056): stem 32, filters 44; reduced: stem 4, filters 8."""
    return _nasnet(net, x, 4 if reduced else 32, 8 if reduced else 44, 4, large=False)


def nasnet_a_large(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """NASNet-A Large (6 @ 4032): stem 96, filters 168; reduced: stem 12, filters 12."""
    return _nasnet(net, x, 12 if reduced else 96, 12 if reduced else 168, 6, large=True)
