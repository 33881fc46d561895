// A client killed with SIGKILL at "append", then run again: see ./journal-kill.ts.
import { killRounds } from "./journal-kill.js";

killRounds("append");
