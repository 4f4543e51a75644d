// pagellm bench serve | cost: the serving benchmark's command lines (see tools/cmd_bench_serve.cpp).
#pragma once

namespace pagellm::cli {

int bench_serve(int argc, char** argv);
int bench_cost(int argc, char** argv);

}  // namespace pagellm::cli
