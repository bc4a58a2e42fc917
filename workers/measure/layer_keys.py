"""Layer fingerprints as the service keys measurements by: recomputed from the programs."""

import hashlib
from collections import OrderedDict

from programs import layer_fingerprint
from schemas import LayerSpec

_LAYER_CACHE_SIZE = 4096
_layer_fps: OrderedDict[int, tuple[LayerSpec, str]] = OrderedDict()


def layer_key(layer: LayerSpec) -> str:
    """The layer's fingerprint, recomputed from its programs (`programs.layer_fingerprint`):
    a fingerprint a spec merely claims never keys a measurement. A layer without programs
    (a stored skeleton) keeps the fingerprint stored with it."""
    hit = _layer_fps.get(id(layer))
    if hit is not None and hit[0] is layer:
        return hit[1]
    if not (layer.forward and layer.backward):
        fp = layer.fingerprint
    else:
        try:
            fp = layer_fingerprint(layer)
        except Exception:  # noqa: BLE001 - unreadable programs fail later, when composed
            raw = (layer.forward + "\n" + layer.backward).encode()
            fp = "unreadable-programs:" + hashlib.sha256(raw).hexdigest()
    _layer_fps[id(layer)] = (layer, fp)
    if len(_layer_fps) > _LAYER_CACHE_SIZE:
        _layer_fps.popitem(last=False)
    return fp
