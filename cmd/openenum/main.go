// Command openenum serves the breaking-change gate (make api/breaking):
//
//	openenum widen BASE REVISION   prints BASE with the open enums of REVISION widened (openenum.Widen)
//	openenum find SPEC             prints the JSON pointer of every open enum of SPEC
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/oncekey/oncekey/internal/service/openenum"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "openenum:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 3 && args[0] == "widen":
		base, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		revision, err := os.ReadFile(args[2])
		if err != nil {
			return err
		}
		out, err := openenum.Widen(base, revision)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	case len(args) == 2 && args[0] == "find":
		spec, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		found, err := openenum.Find(spec)
		if err != nil {
			return err
		}
		if len(found) > 0 {
			fmt.Println(strings.Join(found, "\n"))
		}
		return nil
	}
	return fmt.Errorf("usage: openenum widen BASE REVISION | openenum find SPEC")
}
