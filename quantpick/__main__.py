from quantpick.cli import main

main()
