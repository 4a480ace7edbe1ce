from monologue.cli import main

main()
