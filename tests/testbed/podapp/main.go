// podapp is the one program in the testbed's images for the real node: the pod sandbox ("pause")
// and a workload whose readiness, preStop hook and shutdown a drain test can observe.
//
//	podapp pause    holds a pod's namespaces until SIGTERM, reaping orphans (the sandbox image)
//	podapp serve    answers /ready with 503 until READY_AFTER has passed, then 200; on SIGTERM
//	                records "term", keeps serving for TERM_DELAY, records "exit" and exits
//	podapp prestop  records "prestop" and waits PRESTOP_DELAY (the preStop exec hook)
//
// Records are lines "<event> <pod> <unix ms>" appended to RECORD_FILE (a hostPath the test
// reads), so what happened inside a container outlives the pod.
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: podapp pause|serve|prestop")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		pause()
	case "serve":
		serve()
	case "prestop":
		record("prestop")
		time.Sleep(durationEnv("PRESTOP_DELAY", 0))
	default:
		fmt.Fprintf(os.Stderr, "podapp: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

func pause() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		// As PID 1 of a pod sharing its PID namespace, adopted orphans are ours to reap.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

func serve() {
	started := time.Now()
	readyAfter := durationEnv("READY_AFTER", 0)
	http.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if time.Since(started) < readyAfter {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	addr := ":" + envOr("PORT", "8080")
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			fmt.Fprintf(os.Stderr, "podapp: serving %s: %v\n", addr, err)
			os.Exit(1)
		}
	}()
	record("start")
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM, syscall.SIGINT)
	<-terms
	record("term")
	time.Sleep(durationEnv("TERM_DELAY", 0))
	record("exit")
}

func record(event string) {
	path := os.Getenv("RECORD_FILE")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o666)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podapp: recording %s in %s: %v\n", event, path, err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s %d\n", event, envOr("POD_NAME", "unknown"), time.Now().UnixMilli())
}

func durationEnv(name string, fallback time.Duration) time.Duration {
	value := os.Getenv(name)
	if value == "" {
		return fallback
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podapp: %s=%q is not a duration (like 3s): %v\n", name, value, err)
		os.Exit(2)
	}
	return d
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
