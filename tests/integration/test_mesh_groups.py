"""One process group per mesh axis, checked with real collectives on real processes:
every rank all-gathers its rank over each of its axis groups and compares with Mesh."""
import os
import unittest

from common import main, run

PROBE = os.path.join(os.environ.get("TRIREME_WORKERS", "build/tests/workers"), "mesh_probe")


class MeshGroups(unittest.TestCase):
    def check(self, dp, tp, pp, order):
        world = dp * tp * pp
        proc = run(["run", "--nproc-per-node", str(world), "--", PROBE, str(dp), str(tp),
                    str(pp), order], timeout=120)
        ok_lines = [l for l in proc.stdout.splitlines() if l.endswith(" ok")]
        print(f"dp={dp} tp={tp} pp={pp} {order}: {len(ok_lines)} axis groups verified")
        self.assertEqual(len(ok_lines), world * 3, proc.stdout)
        self.assertNotIn("MISMATCH", proc.stdout)

    def test_tp_dp_pp_2x2x2(self):
        self.check(2, 2, 2, "tp-dp-pp")

    def test_dp_tp_pp_2x2x1(self):
        self.check(2, 2, 1, "dp-tp-pp")

    def test_pp_dp_tp_3x1x2(self):
        self.check(3, 1, 2, "pp-dp-tp")


if __name__ == "__main__":
    main()
