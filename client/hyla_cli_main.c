/* hyla_cli_main.c — main() of the `hyla` command line; everything else is in hyla_cli.c. */
#include "hyla_cli.h"

int main(int argc, char **argv) { return hyla_cli_main(argc, argv); }
