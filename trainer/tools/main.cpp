// sftctl-trainer's entry point: the command line is trainer/tools/trainer_cli.h.
#include "trainer/tools/trainer_cli.h"

int main(int argc, char** argv) { return sftctl::trainer::TrainerMain(argc, argv); }
