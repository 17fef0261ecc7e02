"""The library is installable and exported: install it, then build examples/consumer (a
user's own CMake project doing find_package(trireme), made fault tolerant with
ft::Resumable) against the installed package and run it, alone and on two ranks through
the installed `trireme run`; with a checkpoint directory, a second run continues from the
first's last checkpoint to the same parameters (the same final loss), training nothing."""
import os
import re
import shutil
import subprocess
import unittest

from common import SOURCE, main, temp_dir

BUILD = os.environ.get("TRIREME_BUILD", os.path.join(SOURCE, "build"))


def sh(args, **kw):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class ExampleProject(unittest.TestCase):
    def test_find_package_build_and_run(self):
        work = temp_dir()
        try:
            prefix = os.path.join(work, "prefix")
            sh(["cmake", "--install", BUILD, "--prefix", prefix])
            self.assertTrue(os.path.exists(os.path.join(prefix, "lib", "cmake", "trireme",
                                                        "trireme-config.cmake")))
            consumer = os.path.join(work, "consumer")
            sh(["cmake", "-S", os.path.join(SOURCE, "examples", "consumer"), "-B", consumer,
                "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"])
            sh(["cmake", "--build", consumer])
            exe = os.path.join(consumer, "consumer")
            env = dict(os.environ, OMP_NUM_THREADS="1")
            alone = sh([exe], env=env)
            print(alone.stdout.strip())
            self.assertIn("rank 0 of 1, resumed at step 0,", alone.stdout)
            ckpt = os.path.join(work, "ckpt")
            first = sh([exe, ckpt], env=env)
            self.assertIn("resumed at step 0,", first.stdout)
            steps = [name for name in os.listdir(ckpt) if name != ".writer"]  # (the writer's lock file)
            self.assertEqual(sorted(steps, key=int), ["100", "150", "200"])  # the newest 3
            again = sh([exe, ckpt], env=env)
            print(again.stdout.strip())
            self.assertIn("resumed at step 200,", again.stdout)
            loss = re.compile(r"final loss (\S+),")
            self.assertEqual(loss.search(again.stdout).group(1), loss.search(first.stdout).group(1))
            two = sh([os.path.join(prefix, "bin", "trireme"), "run", "--nproc-per-node", "2",
                      "--", exe])
            print(two.stdout.strip())
            self.assertIn("rank 0 of 2", two.stdout)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
