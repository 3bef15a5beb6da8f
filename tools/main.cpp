// cpfill command-line entry point (placeholder until the subcommands land).
#include <cstdio>

int main() {
    std::puts("cpfill");
    return 0;
}
