#compdef quantpick

_quantpick_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _QUANTPICK_COMPLETE=complete_zsh quantpick)
}

compdef _quantpick_completion quantpick
