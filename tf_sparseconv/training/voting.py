"""Test-time voting over symmetric views of each point cloud: the mean softmax over the
cloud itself and its copies mirrored in x ('mirror', for aligned shapes trained with
--augment mirror) or rotated about the up axis by every multiple of 360/N degrees
('rotations-N', the VRN and MVCNN practice, for shapes trained with --augment rotate12 or
rotate). 'none' is the cloud alone."""
import re

import numpy as np

from tf_sparseconv.data.pipeline import UP_AXIS, rotate_about_up

VOTE_HELP = "none, mirror or rotations-N (N >= 2 views rotated about the up axis, z)"


def parse_vote(text):
    """The canonical name of a vote ('none', 'mirror' or 'rotations-N'); ValueError otherwise."""
    text = str(text).strip()
    if text in ("none", "mirror"):
        return text
    match = re.fullmatch(r"rotations-(\d+)", text)
    if match and 2 <= int(match.group(1)) <= 360:
        return f"rotations-{int(match.group(1))}"
    raise ValueError(f"the vote must be {VOTE_HELP.replace('N >= 2', '2 <= N <= 360')}, got {text!r}")


def vote_views(clouds, vote, up_axis=UP_AXIS):
    """The views [M, N, 3+] (float32) of clouds that vote averages over, one after another;
    mirroring negates x (and the x of normals), rotations turn about the up axis through the
    origin, with normals. The caller's clouds are not changed."""
    vote = parse_vote(vote)
    clouds = _clouds(clouds)
    yield clouds
    if vote == "mirror":
        mirrored = clouds.copy()
        mirrored[..., 0] *= -1
        if mirrored.shape[-1] >= 6:
            mirrored[..., 3] *= -1
        yield mirrored
    elif vote.startswith("rotations-"):
        steps = int(vote.split("-")[1])
        for k in range(1, steps):
            yield rotate_about_up(clouds, 2 * np.pi * k / steps, up_axis).astype(np.float32)


def _clouds(clouds):
    """clouds as float32 [M, N, 3+]; ValueError for anything else (a single cloud [N, 3] would
    be read as N clouds of 3 points, whose x mirroring negates the first point)."""
    array = np.asarray(clouds)
    if array.ndim != 3 or array.shape[-1] < 3 or array.dtype.kind not in "iuf":
        raise ValueError(f"vote_views: clouds must be numbers [M, N, 3+] (x, y, z first), got "
                         f"{array.dtype} {list(array.shape)}")
    return array.astype(np.float32)


def softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def voted_probabilities(predict, clouds, vote):
    """[M, K]: the mean over vote's views of softmax(predict(view)), where predict maps
    clouds [M, N, 3+] to logits [M, K] (or more rows, of which the first M are kept)."""
    total, views = 0.0, 0
    for view in vote_views(clouds, vote):
        logits = np.asarray(predict(view))
        if logits.ndim != 2 or len(logits) < len(view):
            raise ValueError(f"voted_probabilities: predict must map {len(view)} clouds to logits [{len(view)}, K] "
                             f"(or more rows), got shape {list(logits.shape)}")
        total = total + softmax(logits[:len(view)])
        views += 1
    return total / views
