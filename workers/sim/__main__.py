from workers.sim.cli import main

main()
