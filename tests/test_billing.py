"""The Alliance's billing rule ("Allocations and compute scheduling", synced 2026-04-10): the page's own examples on
its fictive bundle, then worked examples from its per-cluster bundles, a pack billed by memory and one by cores."""
from __future__ import annotations

import pytest

from gpupack.core.billing import CORES, GPU, GPU_ONLY, MEMORY, Bill, Bundle, bill, over_bundle

FICTIVE = Bundle(rgu=1.0, cores=3, mem_gb=4)  # the page's fictive bundle: 1 RGU, 3 cores, 4 GB


@pytest.mark.parametrize("bundle, gpus, cores, mem_gb, rgu_eq, term", [
    # the page's examples
    (FICTIVE, 2, 3, 4, 2.0, GPU),  # 2 P100-12gb, 3 cores, 4 GB: 2 RGU equivalents
    (FICTIVE, 1, 5, 5, 5 / 3, CORES),  # 1 RGU, 5 cores, 5 GB: 1.66
    (FICTIVE, 1, 2, 6, 1.5, MEMORY),  # 1 RGU, 2 cores, 6 GB: 1.5
    (Bundle(2.6, 7.8, 10.4), 1, 7.8, 10.4, 2.6, GPU),  # a V100-32gb bundle on the fictive cluster: 2.6
    (Bundle(4.0, 12, 16), 1, 12, 16, 4.0, GPU),  # an A100-40gb bundle: 4.0
    # worked from the page's bundles per GPU
    (Bundle(12.2, 12, 288), 1, 16, 32, 16 / 12 * 12.2, CORES),  # Fir H100: 16 trainings x 1 core: by cores
    (Bundle(12.2, 16, 124.5), 1, 17, 136, 136 / 124.5 * 12.2, MEMORY),  # Rorqual H100, 34 x 4 GB: by memory
    (Bundle(12.2, 14, 250), 1, 8, 100, 12.2, GPU),  # Nibi H100 within its bundle
    (Bundle(1.74, 1.7, 41), 1, 1, 20, 1.74, GPU),  # Fir H100-1g.10gb slice within its bundle
    (Bundle(0.57, 1.7, 17.7), 1, 2, 8, 2 / 1.7 * 0.57, CORES),  # Narval A100-1g.5gb: 2 cores over 1.7
    (Bundle(2.2), 1, 64, 500, 2.2, GPU_ONLY),  # a site without bundles: the GPU alone, as before
])
def test_the_largest_of_gpu_cores_and_memory_bills(bundle, gpus, cores, mem_gb, rgu_eq, term):
    charged = bill(bundle, cores, mem_gb, gpus)
    assert charged.rgu_equivalents == pytest.approx(rgu_eq) and charged.term == term
    assert charged.multiple == pytest.approx(rgu_eq / (gpus * bundle.rgu))


def test_only_a_request_over_its_bundle_is_flagged():
    assert over_bundle(Bundle(12.2, 16, 124.5), 8, 100) is None
    flagged = over_bundle(Bundle(12.2, 16, 124.5), 17, 136)
    assert isinstance(flagged, Bill) and flagged.term == MEMORY and flagged.multiple == pytest.approx(136 / 124.5)
