// A client killed with SIGKILL at "answer", then run again: see ./journal-kill.ts.
import { killRounds } from "./journal-kill.js";

killRounds("answer");
