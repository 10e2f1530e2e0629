"""Classic image classifiers in torchvision's layout (inference form: no auxiliary head, no
dropout, batch norm with running statistics).

* Inception-v3: Szegedy et al., "Rethinking the Inception Architecture for Computer Vision",
  CVPR 2016; torchvision `inception_v3` (Mixed_5b..7c, BasicConv2d = conv + BN(eps 1e-3) + ReLU).
* ResNet-50: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016; torchvision
  Bottleneck (stride on the 3x3, "ResNet v1.5").
* ResNeXt-50 32x4d: Xie et al., "Aggregated Residual Transformations", CVPR 2017; same Bottleneck
  with a 32-group 3x3.
* SqueezeNet 1.1: Iandola et al. 2016; torchvision `squeezenet1_1` (biased convs, no BN).

`reduced=True` divides channel counts by 8 (ResNeXt keeps its 32 groups, with 1 instead of 4
channels per group) and the caller feeds a small image; every block stays in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from tvm import relax

from ._builder import IntPair, Net

NUM_CLASSES = 1000


# -- Inception-v3 -------------------------------------------------------------------------------
def _basic(net: Net, x: relax.Expr, out_ch: int, kernel: IntPair, stride: int = 1,
           padding: IntPair = 0) -> relax.Var:
    """torchvision BasicConv2d: bias-free conv, BN with TF's eps 1e-3, ReLU."""
    return net.relu(net.conv_bn(x, out_ch, kernel, stride, padding, eps=1e-3))


def _chain(net: Net, x: relax.Expr, layers: Sequence[tuple]) -> relax.Var:
    """A branch of BasicConv2d's, each given as (out_ch, kernel[, stride[, padding]])."""
    for layer in layers:
        x = _basic(net, x, *layer)
    return x


def _pool_branch(net: Net, x: relax.Expr, out_ch: int) -> relax.Var:
    # torch's avg_pool2d default count_include_pad=True: border windows divide by 9
    return _basic(net, net.avg_pool(x, 3, 1, 1, count_include_pad=True), out_ch, 1)


def _inception_a(net: Net, x: relax.Expr, pool_ch: int, w: int) -> relax.Var:
    return net.concat([
        _basic(net, x, 64 // w, 1),
        _chain(net, x, [(48 // w, 1), (64 // w, 5, 1, 2)]),
        _chain(net, x, [(64 // w, 1), (96 // w, 3, 1, 1), (96 // w, 3, 1, 1)]),
        _pool_branch(net, x, pool_ch),
    ])


def _inception_b(net: Net, x: relax.Expr, w: int) -> relax.Var:
    return net.concat([
        _basic(net, x, 384 // w, 3, 2),
        _chain(net, x, [(64 // w, 1), (96 // w, 3, 1, 1), (96 // w, 3, 2)]),
        net.max_pool(x, 3, 2),
    ])


def _inception_c(net: Net, x: relax.Expr, c7: int, w: int) -> relax.Var:
    row, col = ((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0))  # factorized 7x7: 1x7 and 7x1
    return net.concat([
        _basic(net, x, 192 // w, 1),
        _chain(net, x, [(c7, 1), (c7, *row), (192 // w, *col)]),
        _chain(net, x, [(c7, 1), (c7, *col), (c7, *row), (c7, *col), (192 // w, *row)]),
        _pool_branch(net, x, 192 // w),
    ])


def _inception_d(net: Net, x: relax.Expr, w: int) -> relax.Var:
    return net.concat([
        _chain(net, x, [(192 // w, 1), (320 // w, 3, 2)]),
        _chain(net, x, [(192 // w, 1), (192 // w, (1, 7), 1, (0, 3)),
                        (192 // w, (7, 1), 1, (3, 0)), (192 // w, 3, 2)]),
        net.max_pool(x, 3, 2),
    ])


def _inception_e(net: Net, x: relax.Expr, w: int) -> relax.Var:
    def fork(y: relax.Var) -> relax.Var:  # the 1x3 / 3x1 pair that splits a branch in two
        return net.concat([_basic(net, y, 384 // w, (1, 3), 1, (0, 1)),
                           _basic(net, y, 384 // w, (3, 1), 1, (1, 0))])

    return net.concat([
        _basic(net, x, 320 // w, 1),
        fork(_basic(net, x, 384 // w, 1)),
        fork(_chain(net, x, [(448 // w, 1), (384 // w, 3, 1, 1)])),
        _pool_branch(net, x, 192 // w),
    ])


def inception_v3(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """Inception-v3 (torchvision layout, no aux head) at 299x299, or 1/8 width at 75x75."""
    w = 8 if reduced else 1
    x = _chain(net, x, [(32 // w, 3, 2), (32 // w, 3), (64 // w, 3, 1, 1)])
    x = net.max_pool(x, 3, 2)
    x = _chain(net, x, [(80 // w, 1), (192 // w, 3)])
    x = net.max_pool(x, 3, 2)
    for pool_ch in (32, 64, 64):  # Mixed_5b, 5c, 5d
        x = _inception_a(net, x, pool_ch // w, w)
    x = _inception_b(net, x, w)  # Mixed_6a
    for c7 in (128, 160, 160, 192):  # Mixed_6b..6e
        x = _inception_c(net, x, c7 // w, w)
    x = _inception_d(net, x, w)  # Mixed_7a
    x = _inception_e(net, _inception_e(net, x, w), w)  # Mixed_7b, 7c
    return net.dense(net.global_pool(x), NUM_CLASSES)


# -- ResNet-50 / ResNeXt-50 ---------------------------------------------------------------------
def _bottleneck(net: Net, x: relax.Var, width: int, out_ch: int, stride: int,
                groups: int) -> relax.Var:
    y = net.relu(net.conv_bn(x, width, 1))
    y = net.relu(net.conv_bn(y, width, 3, stride, 1, groups))
    # small gain on the branch's last conv (Fixup-like): BN runs on fixed statistics, so an
    # ordinary init would double the residual stream's variance at every block
    y = net.conv_bn(y, out_ch, 1, gain=0.1)
    shortcut = x
    if stride != 1 or net.shape(x)[1] != out_ch:
        shortcut = net.conv_bn(x, out_ch, 1, stride, gain=1.0)
    return net.relu(net.add(y, shortcut))


def _resnet(net: Net, x: relax.Var, reduced: bool, groups: int, width: int) -> relax.Var:
    """torchvision ResNet-50 family; `width` is the first stage's 3x3 width (doubles per stage)."""
    div = 8 if reduced else 1
    x = net.max_pool(net.relu(net.conv_bn(x, 64 // div, 7, 2, 3)), 3, 2, 1)
    for stage, blocks in enumerate((3, 4, 6, 3)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck(net, x, width << stage, (256 // div) << stage, stride, groups)
    return net.dense(net.global_pool(x), NUM_CLASSES)


def resnet50(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """ResNet-50 (torchvision Bottleneck, stride on the 3x3) at 224x224."""
    return _resnet(net, x, reduced, groups=1, width=8 if reduced else 64)


def resnext50_32x4d(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """ResNeXt-50 32x4d; reduced keeps 32 groups with 1 channel per group in the first stage."""
    return _resnet(net, x, reduced, groups=32, width=32 if reduced else 128)


# -- SqueezeNet 1.1 -----------------------------------------------------------------------------
def _conv_relu(net: Net, x: relax.Expr, out_ch: int, kernel: int, stride: int = 1,
               padding: int = 0) -> relax.Var:
    return net.relu(net.conv(x, out_ch, kernel, stride, padding, bias=True))


def _fire(net: Net, x: relax.Var, squeeze: int, expand: int) -> relax.Var:
    s = _conv_relu(net, x, squeeze, 1)
    return net.concat([_conv_relu(net, s, expand, 1), _conv_relu(net, s, expand, 3, 1, 1)])


def squeezenet1_1(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """SqueezeNet 1.1 (torchvision): fire modules, ceil-mode max pools, conv classifier."""
    w = 8 if reduced else 1
    x = _conv_relu(net, x, 64 // w, 3, 2)
    fires = [[(16, 64), (16, 64)], [(32, 128), (32, 128)],
             [(48, 192), (48, 192), (64, 256), (64, 256)]]
    for group in fires:  # each group of fire modules follows a ceil-mode 3x3/2 max pool
        x = net.max_pool(x, 3, 2, ceil_mode=True)
        for squeeze, expand in group:
            x = _fire(net, x, squeeze // w, expand // w)
    return net.global_pool(_conv_relu(net, x, NUM_CLASSES, 1))
