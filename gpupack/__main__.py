from gpupack.cli import console_main

console_main()
