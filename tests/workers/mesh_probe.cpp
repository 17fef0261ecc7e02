// Launched by tests/integration/test_mesh_groups.py on dp*tp*pp ranks: builds one process
// group per mesh axis and checks, with real collectives, that each group holds exactly the
// ranks Mesh::group names, in coordinate order.
//   mesh_probe DP TP PP ORDER
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "trireme/dist/world.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: mesh_probe DP TP PP ORDER\n");
    return 2;
  }
  trireme::dist::World world = trireme::dist::World::from_env();
  const auto mesh = trireme::dist::Mesh::from_sizes(std::atoi(argv[1]), std::atoi(argv[2]),
                                                    std::atoi(argv[3]), argv[4]);
  trireme::dist::MeshGroups groups = world.mesh_groups(mesh);
  int failures = 0;
  for (const auto& axis : mesh.axes()) {
    const auto& group = groups.axis(axis.name);
    const auto expected = mesh.group(world.rank(), axis.name);
    std::vector<at::Tensor> mine{at::full({1}, world.rank(), at::kLong)};
    std::vector<std::vector<at::Tensor>> all(1);
    for (int i = 0; i < group->getSize(); ++i) all[0].push_back(at::empty({1}, at::kLong));
    group->allgather(all, mine)->wait();
    std::vector<int> members;
    for (const auto& t : all[0]) members.push_back(static_cast<int>(t.item<int64_t>()));
    const bool ok = members == expected && group->getRank() == groups.coord(axis.name);
    failures += !ok;
    std::string text;
    for (int m : members) text += std::to_string(m) + " ";
    std::printf("rank %d axis %s group [ %s] %s\n", world.rank(), axis.name.c_str(), text.c_str(),
                ok ? "ok" : "MISMATCH");
  }
  return failures == 0 ? 0 : 1;
}
