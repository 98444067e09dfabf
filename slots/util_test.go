package slots_test

import "runtime"

func runtimeGosched() { runtime.Gosched() }
