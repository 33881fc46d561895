// Command mechanism draws the pictures of Oncekey's mechanism in docs/img
// (a request's sequence through the engine, the gateway's key states) as
// SVG from their text sources in docs/img/src, one NAME.svg for each
// NAME.txt. A source is a few lines in a small format of its own (see
// source.go, and each source's header); the drawing uses the standard
// library alone and gives the same bytes for the same source, so that
// docs/img/SOURCES.sha256 and the test in this package can tell a picture
// that is stale.
//
//	go -C tools build -o ../bin/mechanism ./mechanism && bin/mechanism -out docs/img docs/img/src/request-sequence.txt
//
// make docs/mechanism redraws both pictures and records their sources.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	out := flag.String("out", "docs/img", "the directory each picture is written to, as NAME.svg for a source NAME.txt")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: mechanism [-out DIR] SOURCE.txt...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for _, src := range flag.Args() {
		if err := render(src, *out); err != nil {
			fmt.Fprintln(os.Stderr, "mechanism:", err)
			os.Exit(1)
		}
	}
}

// render draws the picture of the source file src into dir.
func render(src, dir string) error {
	if filepath.Ext(src) != ".txt" {
		return fmt.Errorf("%s: a source is named NAME.txt", src)
	}
	text, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	picture, err := draw(src, text)
	if err != nil {
		return err
	}
	name := strings.TrimSuffix(filepath.Base(src), ".txt") + ".svg"
	return os.WriteFile(filepath.Join(dir, name), picture, 0o644)
}
