// granule-cli: model info, tokenizer, and chat from the terminal (placeholder until filled).
#include <cstdio>
int main() { std::puts("granule-cli " GRANULE_VERSION); return 0; }
