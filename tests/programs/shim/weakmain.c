/* weak.c's probes from a shared library the program links (loaded at
 * start-up, relocated before the preloaded shim): see tests/tests/shim_symbols.rs. */
int weak_probe_main(int argc, char **argv);

int main(int argc, char **argv) { return weak_probe_main(argc, argv); }
